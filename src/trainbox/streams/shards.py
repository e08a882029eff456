"""WebDataset-layout tar shards: members grouped by key (KEY.cls, KEY.npy, ...) written and
read front to back, and the manifest that lists each shard's sample count and size, so that
planning an epoch reads one small file rather than every tar."""

from __future__ import annotations

import io
import itertools
import json
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from trainbox import atomic
from trainbox.errors import UsageError

FORMAT = "trainbox-shards/1"
MANIFEST = "manifest.json"
HINT = "rewrite the shard (trainbox.tasks.to_shards), or set data.args.on_corrupt=skip"

# One sample: its key and its members' bytes by extension ("cls", "npy", "png"...).
Sample = tuple[str, dict[str, bytes]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Shard:
    """One tar as the manifest lists it."""

    # Where it is (the manifest's relative paths resolved against its folder).
    path: Path
    # Samples (key groups) it holds.
    samples: int
    # Its size in bytes when written: a smaller file is truncated.
    size: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """A set of shards, in the order the converter wrote them."""

    # The manifest file itself.
    path: Path
    # The shards.
    shards: tuple[Shard, ...]

    @property
    def counts(self) -> list[int]:
        """Samples per shard, in manifest order."""
        return [shard.samples for shard in self.shards]


class ShardFault(Exception):
    """A shard or member that cannot be read; `line` names it."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def key_and_ext(name: str) -> tuple[str, str]:
    """WebDataset's split of a member name: the key up to the first dot of its base name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def write_shard(path: Path, samples: Iterable[Sample]) -> int:
    """Write one tar atomically, members sorted per sample; returns the samples written."""
    buffer = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples:
            for ext in sorted(members):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(members[ext]), 0, 0o644
                tar.addfile(info, io.BytesIO(members[ext]))
            count += 1
    atomic.write(path, [buffer.getvalue()])
    return count


def write_shards(directory: Path, samples: Iterable[Sample], *, per_shard: int) -> Path:
    """`samples` as tars of `per_shard` samples each (the last may hold fewer), and their
    manifest; returns the manifest's path."""
    directory.mkdir(parents=True, exist_ok=True)
    shards = []
    stream = iter(samples)
    for number in itertools.count():
        chunk = list(itertools.islice(stream, per_shard))
        if not chunk:
            break
        path = directory / f"shard-{number:06d}.tar"
        count = write_shard(path, chunk)
        shards.append(Shard(path=path, samples=count, size=path.stat().st_size))
    return write_manifest(directory, shards)


def write_manifest(directory: Path, shards: Iterable[Shard]) -> Path:
    """manifest.json beside the shards, with paths relative to it."""
    path = directory / MANIFEST
    listed = [
        {"path": shard.path.name, "samples": shard.samples, "bytes": shard.size} for shard in shards
    ]
    atomic.write_json(path, {"format": FORMAT, "shards": listed})
    return path


def read_manifest(path: Path, *, key: str) -> Manifest:
    """The manifest at `path` (or `path`/manifest.json); one UsageError naming every problem."""
    file = path / MANIFEST if path.is_dir() else path
    hint = f"point {key} at a manifest.json that trainbox.tasks.to_shards wrote"
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(
            f"{key}: cannot read {file} ({type(err).__name__}: {err})", hint=hint
        ) from err
    if not isinstance(raw, Mapping) or raw.get("format") != FORMAT:
        raise UsageError(f"{key}: {file} is not a {FORMAT} manifest", hint=hint)
    shards, problems = [], []
    for number, entry in enumerate(raw.get("shards") or []):
        shard = _entry(file.parent, entry)
        if shard is None:
            problems.append(f"{file} shard {number} is {entry!r}, not a path, samples and bytes")
        else:
            shards.append(shard)
    if not shards and not problems:
        problems.append(f"{file} lists no shards")
    if problems:
        raise UsageError([f"{key}: {p}" for p in problems], hint=hint)
    return Manifest(path=file, shards=tuple(shards))


def _entry(folder: Path, entry: Any) -> Shard | None:
    if not isinstance(entry, Mapping):
        return None
    name, samples, size = entry.get("path"), entry.get("samples"), entry.get("bytes")
    if not (isinstance(name, str) and _count(samples) and _count(size)):
        return None
    return Shard(path=folder / name, samples=samples, size=size)


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def missing_or_short(shards: Iterable[Shard]) -> list[str]:
    """The shards that are gone or smaller than written (one stat each): what start-up sees."""
    found = []
    for shard in shards:
        try:
            size = shard.path.stat().st_size
        except OSError as err:
            found.append(f"shard {shard.path} cannot be read ({type(err).__name__})")
            continue
        if size != shard.size:
            found.append(f"shard {shard.path} is {size} bytes, not the {shard.size} written")
    return found


class Cursor:
    """Reads one shard's samples front to back, reopening only to go back; `read(shard, i)`.

    Members of the samples passed over are not read: tarfile seeks past their data.
    """

    def __init__(self) -> None:
        self._shard: Shard | None = None
        self._tar: tarfile.TarFile | None = None
        self._groups: Iterator[tuple[str, list[tarfile.TarInfo]]] = iter(())
        self._next = 0

    def read(self, shard: Shard, member: int) -> Sample:
        """Sample `member` of `shard`; ShardFault naming both when it cannot be read."""
        if shard != self._shard or member < self._next:
            self._open(shard)
        try:
            while self._next <= member:
                key, infos = next(self._groups)
                self._next += 1
            return key, {key_and_ext(info.name)[1]: self._data(info) for info in infos}
        except StopIteration:
            self.close()
            raise ShardFault(
                f"shard {shard.path} ends before sample {member} (the manifest lists"
                f" {shard.samples})"
            ) from None
        except (tarfile.TarError, OSError, EOFError) as err:
            # The tar's reader is past use; the next read starts the shard again.
            self.close()
            raise ShardFault(
                f"shard {shard.path} sample {member}: {type(err).__name__}: {err}"
            ) from err

    def close(self) -> None:
        """Close the open shard, if any."""
        if self._tar is not None:
            self._tar.close()
        self._shard, self._tar, self._groups, self._next = None, None, iter(()), 0

    def _open(self, shard: Shard) -> None:
        self.close()
        try:
            # Not streaming ("r|"): a plain file lets tarfile seek over data it does not read.
            self._tar = tarfile.open(shard.path, mode="r:")  # noqa: SIM115 (closed by close())
        except (tarfile.TarError, OSError) as err:
            raise ShardFault(
                f"shard {shard.path} cannot be opened: {type(err).__name__}: {err}"
            ) from err
        self._shard, self._groups = shard, _groups(self._tar)

    def _data(self, info: tarfile.TarInfo) -> bytes:
        """One member's bytes; EOFError when the file ends inside them."""
        assert self._tar is not None  # read() opened it
        handle = self._tar.extractfile(info)
        data = handle.read() if handle is not None else b""
        if len(data) != info.size:
            raise EOFError(f"member {info.name} is cut short")
        return data


def _groups(tar: tarfile.TarFile) -> Iterator[tuple[str, list[tarfile.TarInfo]]]:
    """The tar's file members grouped by key, in file order (headers only)."""
    key, infos = None, []
    for info in tar:
        if not info.isfile():
            continue
        name_key = key_and_ext(info.name)[0]
        if key is not None and name_key != key:
            yield key, infos
            infos = []
        key = name_key
        infos.append(info)
    if key is not None:
        yield key, infos
