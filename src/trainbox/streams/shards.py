"""WebDataset-layout tar shards: members grouped by key (KEY.cls, KEY.npy, ...) written and
read front to back, and the manifest that lists each shard's sample count and size, so that
planning an epoch reads one small file rather than every tar."""

from __future__ import annotations

import functools
import io
import itertools
import json
import os
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeGuard

from trainbox import atomic
from trainbox.errors import UsageError
from trainbox.streams import headers, sources

FORMAT = "trainbox-shards/1"
MANIFEST = "manifest.json"
# Shards whose size start-up asks for at once (requests to a server wait on the network).
CHECKS = 16
HINT = "rewrite the shard (trainbox.tasks.to_shards), or set data.args.on_corrupt=skip"

# How a compressed file begins: named when a shard is one (the reader takes plain tars only).
COMPRESSED = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}

# One sample: its key and its members' bytes by extension ("cls", "npy", "png"...).
Sample = tuple[str, dict[str, bytes]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Shard:
    """One tar as the manifest lists it."""

    # Where it is: a path, an http(s) URL or a pipe: command (the manifest's relative paths
    # resolved against its own location).
    location: str
    # Samples (key groups) it holds.
    samples: int
    # Its size in bytes when written: a smaller file is truncated.
    size: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """A set of shards, in the order the converter wrote them."""

    # Where the manifest itself was read: a path, an http(s) URL or a pipe: command.
    location: str
    # The shards.
    shards: tuple[Shard, ...]

    @property
    def counts(self) -> list[int]:
        """Samples per shard, in manifest order."""
        return [shard.samples for shard in self.shards]


class ShardFault(Exception):
    """A shard or member that cannot be read; `line` names it, `hint` says what to do."""

    def __init__(self, line: str, *, hint: str = HINT) -> None:
        super().__init__(line)
        self.line, self.hint = line, hint


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
        shards.append(Shard(location=str(path), samples=count, size=path.stat().st_size))
    return write_manifest(directory, shards)


def write_manifest(directory: Path, shards: Iterable[Shard], *, name: str = MANIFEST) -> Path:
    """`directory`/`name` listing the shards (files) with paths relative to it, so that the
    set moves as one folder."""
    path = directory / name
    listed = [
        {
            "path": Path(os.path.relpath(shard.location, directory)).as_posix(),
            "samples": shard.samples,
            "bytes": shard.size,
        }
        for shard in shards
    ]
    atomic.write_json(path, {"format": FORMAT, "shards": listed})
    return path


def manifest_location(where: str) -> str:
    """The manifest's own location when `where` names its folder (a directory, or a URL ending
    in /); `where` itself otherwise."""
    kind = sources.kind_of(where)
    if (kind == "http" and where.endswith("/")) or (kind == "path" and Path(where).is_dir()):
        return where + MANIFEST if kind == "http" else str(Path(where) / MANIFEST)
    return where


def read_manifest(where: Path | str, *, key: str) -> Manifest:
    """The manifest at `where` (a path, URL or pipe: command, or the folder holding it); one
    UsageError naming every problem."""
    location = manifest_location(str(where))
    hint = f"point {key} at a manifest.json that trainbox.tasks.to_shards wrote"
    try:
        raw = json.loads(sources.read_all(location))
    except (OSError, ValueError) as err:
        raise UsageError(
            f"{key}: cannot read {location} ({type(err).__name__}: {err})", hint=hint
        ) from err
    if not isinstance(raw, Mapping) or raw.get("format") != FORMAT:
        raise UsageError(f"{key}: {location} is not a {FORMAT} manifest", hint=hint)
    shards, problems = [], []
    for number, entry in enumerate(raw.get("shards") or []):
        shard = _entry(location, entry)
        if isinstance(shard, str):
            problems.append(f"{location} shard {number} {shard}")
        else:
            shards.append(shard)
    if not shards and not problems:
        problems.append(f"{location} lists no shards")
    if problems:
        raise UsageError([f"{key}: {p}" for p in problems], hint=hint)
    return Manifest(location=location, shards=tuple(shards))


def _entry(manifest: str, entry: Any) -> Shard | str:
    """The shard `entry` lists, or what is wrong with it."""
    if not isinstance(entry, Mapping):
        return f"is {entry!r}, not a path, samples and bytes"
    name, samples, size = entry.get("path"), entry.get("samples"), entry.get("bytes")
    if not (isinstance(name, str) and _count(samples) and _count(size)):
        return f"is {entry!r}, not a path, samples and bytes"
    location = sources.resolve(manifest, name)
    if location is None:
        return f"is the relative path {name!r}: a pipe: manifest needs absolute paths or URLs"
    if sources.kind_of(location) == "unknown":
        return f"is {name!r}, {sources.UNKNOWN}"
    return Shard(location=location, samples=samples, size=size)


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def missing_or_short(shards: Sequence[Shard], *, timeout: float = sources.TIMEOUT) -> list[str]:
    """The shards that are gone or smaller than written (one stat or one request each, a few at
    a time): what start-up sees. A pipe: shard's size is not known without running it."""
    if not shards:
        return []
    with ThreadPoolExecutor(max_workers=min(CHECKS, len(shards))) as pool:
        found = pool.map(functools.partial(_problem, timeout=timeout), shards)
        return [line for line in found if line is not None]


def _problem(shard: Shard, *, timeout: float) -> str | None:
    """What is wrong with one shard's size, if anything."""
    try:
        size = sources.size_of(shard.location, timeout=timeout)
    except OSError as err:
        return f"shard {shard.location} cannot be read ({_reason(err)})"
    if size is not None and size != shard.size:
        return f"shard {shard.location} is {size} bytes, not the {shard.size} written"
    return None


def _reason(err: OSError) -> str:
    """A source's own message, or the error's type for a plain file (FileNotFoundError)."""
    return str(err) if isinstance(err, sources.SourceError) else type(err).__name__


def index_shard(path: Path) -> Shard:
    """`path` as a manifest lists it, its samples counted from its headers as Cursor groups
    them; ShardFault names what the reader would trip on (no member data is read)."""
    try:
        with path.open("rb") as handle:
            return _indexed(path, handle)
    except FileNotFoundError:
        raise ShardFault(f"{path} does not exist") from None
    except IsADirectoryError:
        raise ShardFault(f"{path} is a folder, not a tar") from None
    except OSError as err:
        raise ShardFault(f"{path} cannot be read ({type(err).__name__}: {err})") from err


def _indexed(path: Path, handle: IO[bytes]) -> Shard:
    size = os.fstat(handle.fileno()).st_size
    if size == 0:
        raise ShardFault(f"{path} is empty (0 bytes)")
    try:
        tar = tarfile.open(fileobj=handle, mode="r:")  # noqa: SIM115 (closed below)
    except tarfile.TarError as err:
        handle.seek(0)
        head = handle.read(8)
        packed = [
            f"{name}-compressed" for magic, name in COMPRESSED.items() if head.startswith(magic)
        ]
        raise ShardFault(f"{path} is not a tar ({packed[0] if packed else err})") from None
    with tar:
        try:
            samples, problems = _count_samples(tar)
        except tarfile.TarError as err:
            raise ShardFault(f"{path} is cut short or damaged ({err})") from None
        # tarfile ends quietly at a header cut short or garbled after the first, and a tar cut
        # at a member's edge is a valid shorter one: only the end-of-archive block tells.
        end = tar.offset
    handle.seek(end)
    if handle.read(tarfile.BLOCKSIZE) != bytes(tarfile.BLOCKSIZE):
        raise ShardFault(
            f"{path} is cut short or damaged (no end-of-archive block after its members, at"
            f" byte {end} of {size})"
        )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ShardFault(f"{path}: {problems[0]}{more}")
    if samples == 0:
        raise ShardFault(f"{path} holds no samples (no file members)")
    return Shard(location=str(path), samples=samples, size=size)


def _count_samples(tar: tarfile.TarFile) -> tuple[int, list[str]]:
    """The samples Cursor would read (runs of file members with one key), and what would make
    them other samples than the tar's writer meant."""
    problems: list[str] = []
    seen: set[str] = set()
    key: str | None = None
    exts: set[str] = set()
    count = 0
    for info in tar:
        problem = _member_problem(info)
        if problem is not None:
            problems.append(problem)
        if not info.isfile():
            continue
        name_key, ext = key_and_ext(info.name)
        if name_key != key:
            if name_key in seen:
                problems.append(
                    f"the key {name_key} again at member {info.name}, after other samples (a"
                    " sample's members must be consecutive: GNU tar --sort=name keeps them so)"
                )
            seen.add(name_key)
            key, exts, count = name_key, set(), count + 1
        elif ext in exts:
            problems.append(f"member {info.name} twice")
        exts.add(ext)
    return count, problems


def _member_problem(info: tarfile.TarInfo) -> str | None:
    """What makes one member no part of a sample, if anything; folders are passed over."""
    if info.isdir():
        return None
    if not info.isfile():
        # Cursor reads files only: a sample whose member is a link would lack it.
        return f"member {info.name} is a link or special file, which the reader skips"
    base = info.name.rpartition("/")[2]
    if base.startswith("."):
        return f"member {info.name} has no key (its name starts with a dot)"
    if not key_and_ext(info.name)[1]:
        return f"member {info.name} has no extension (members are named KEY.EXT)"
    return None


# A member as the cursor meets it: its name, its size, and where its data is (the TarInfo
# when tarfile reads the shard, the data's offset in the file when headers.py does).
Entry = tuple[str, int, tarfile.TarInfo | int]


class Cursor:
    """Reads one shard's samples front to back, reopening only to go back; `read(shard, i)`.

    Members of the samples passed over are not read: a file's reader seeks past their data,
    and a stream's (a URL or a pipe: command, read in one pass) reads and drops it. A file's
    plain headers are read by headers.py, which costs a fraction of tarfile per member; at
    any other header tarfile reads that file again from its start, and from then on.
    """

    def __init__(self, *, timeout: float = sources.TIMEOUT, plain: bool = True) -> None:
        self._timeout = timeout
        # Whether headers.py reads the plain headers of files (tarfile reads everything else).
        self._plain = plain
        # Files with a header headers.py leaves to tarfile.
        self._not_plain: set[str] = set()
        self._shard: Shard | None = None
        self._stream: IO[bytes] | None = None
        self._tar: tarfile.TarFile | None = None
        self._members: Iterator[Entry] = iter(())
        # The first member of the next sample: its header read, its data not yet.
        self._ahead: Entry | None = None
        self._next = 0

    def read(self, shard: Shard, member: int) -> Sample:
        """Sample `member` of `shard`; ShardFault naming both when it cannot be read."""
        try:
            try:
                return self._read(shard, member)
            except headers.NotPlain:
                self._not_plain.add(shard.location)
                self._open(shard)
                return self._read(shard, member)
        except StopIteration:
            self.close()
            raise ShardFault(
                f"shard {shard.location} ends before sample {member} (the manifest lists"
                f" {shard.samples})"
            ) from None
        except (tarfile.TarError, OSError, EOFError) as err:
            # The tar's reader is past use; the next read starts the shard again.
            self.close()
            raise ShardFault(
                f"shard {shard.location} sample {member}: {type(err).__name__}: {err}"
            ) from err

    def _read(self, shard: Shard, member: int) -> Sample:
        if shard != self._shard or member < self._next:
            self._open(shard)
        while True:
            sample = self._sample(keep=self._next == member)
            self._next += 1
            if sample is not None:
                return sample

    def close(self) -> None:
        """Close the open shard, if any."""
        if self._tar is not None:
            self._tar.close()
        if self._stream is not None:
            self._stream.close()
        self._shard, self._stream, self._tar, self._members = None, None, None, iter(())
        self._ahead, self._next = None, 0

    def _open(self, shard: Shard) -> None:
        """Open `shard` at its start (OSError or TarError when it cannot be; NotPlain when its
        first header is left to tarfile)."""
        self.close()
        seekable = sources.kind_of(shard.location) == "path"
        self._stream = sources.open_stream(shard.location, timeout=self._timeout)
        self._shard = shard
        if seekable and self._plain and shard.location not in self._not_plain:
            self._members = headers.file_members(self._stream)
        else:
            # A file is opened seekable ("r:"), so tarfile seeks over data it does not read; a
            # URL or a command's output is a stream ("r|"), read once front to back.
            self._tar = tarfile.open(  # noqa: SIM115 (closed by close())
                fileobj=self._stream, mode="r:" if seekable else "r|"
            )
            self._members = ((i.name, i.size, i) for i in self._tar if i.isfile())
        self._ahead = next(self._members, None)

    def _sample(self, *, keep: bool) -> Sample | None:
        """The next sample's members (their data read only when `keep`); StopIteration at the
        end. Each member's data is read before the next header, as a stream requires."""
        first = self._ahead
        if first is None:
            raise StopIteration
        key, members = key_and_ext(first[0])[0], {}
        entry: Entry | None = first
        while entry is not None:
            entry_key, ext = key_and_ext(entry[0])
            if entry_key != key:
                break
            if keep:
                members[ext] = self._data(entry)
            entry = next(self._members, None)
        self._ahead = entry
        return (key, members) if keep else None

    def _data(self, entry: Entry) -> bytes:
        """One member's bytes; EOFError when the file ends inside them."""
        name, size, where = entry
        if isinstance(where, int):
            assert self._stream is not None  # read() opened it
            self._stream.seek(where)
            data = self._stream.read(size)
            if len(data) != size:
                # The file ends inside them: tarfile reads it again, and fails its own way.
                raise headers.NotPlain
        else:
            assert self._tar is not None  # read() opened it
            handle = self._tar.extractfile(where)
            data = handle.read() if handle is not None else b""
        if len(data) != size:
            raise EOFError(f"member {name} is cut short")
        return data
