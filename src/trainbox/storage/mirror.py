"""A run's working copy and its place in the store, kept in step.

The store holds the truth; the working copy (location.working_copy) is a node-local cache.

- **What counts.** A checkpoint counts in the store only once its completion marker is there,
  and the marker is uploaded last: a one-file checkpoint's `.sha256` sidecar after the file,
  a sharded checkpoint's `manifest.json` after every file it lists. An upload killed halfway
  leaves objects no resume takes (and the next prune removes them).
- **Starting.** Rank 0 lists the prefix once (`snapshot`) and sends what it found to every
  rank; each fetches only what it reads, and every process on a node shares one fetch of a
  file (`fetch`, under a lock in the working copy). No other rank ever lists.
- **Writing.** What a rank writes locally it uploads itself: rank 0 the run's files and the
  one-file checkpoint, each rank its own shards.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainbox.storage.location import Location, parse, working_copy
from trainbox.storage.store import PROBE, RUN, Entry, Store, Timeouts

CHECKPOINTS = "checkpoints"
# A one-file checkpoint and its digest sidecar, the marker that it is complete.
_ONE_FILE = re.compile(r"checkpoints/(step-\d{8}\.pt)(\.sha256)?")
# A sharded checkpoint's folder and a file in it; manifest.json is its marker.
_SHARDED = re.compile(r"checkpoints/(step-\d{8}\.dcp)/([^/]+)")
SHARDED_MARKER = "manifest.json"
# Files in the working copy that are the copy's own bookkeeping, never uploaded.
_FETCHED = ".trainbox-fetched.json"
_LOCK = ".trainbox-fetch.lock"
# In a sharded checkpoint fetched in part: the URL its other files come from (checkpoint/shards.py).
SOURCE = ".trainbox-source"
# Local files that stay local: the run lock, temp files, the bookkeeping above, damaged/.
_LOCAL_ONLY = re.compile(r"(^|/)\.|(^|/)trainbox\.lock$|^checkpoints/")


@dataclass(frozen=True, kw_only=True, slots=True)
class Snapshot:
    """What one listing of a run's prefix found: sent by rank 0 to every rank."""

    # The run's own files (config.yaml, metrics.jsonl, summary.json, hang/...), not checkpoints.
    run_files: dict[str, Entry]
    # The newest complete checkpoint (`checkpoints/step-N.pt` or `.dcp`), or None.
    checkpoint: str | None
    # Every object of that checkpoint, by relative path.
    checkpoint_files: dict[str, Entry]
    # Checkpoints that are complete in the store, oldest first.
    complete: list[str] = field(default_factory=list)

    def sharded_share(self, rank: int, world_size: int) -> dict[str, Entry]:
        """The files of a sharded checkpoint that `rank` reads before loading: the index,
        record and manifest, its own shards, and its share of the checksum check (files
        r, r + W, ... in name order: checkpoint/shards.py's `check`)."""
        assert self.checkpoint is not None
        folder = f"{self.checkpoint}/"
        names = sorted(key.removeprefix(folder) for key in self.checkpoint_files)
        listed = [name for name in names if name != SHARDED_MARKER]
        wanted = {SHARDED_MARKER, ".metadata", "record.pt", *listed[rank::world_size]}
        wanted |= {name for name in names if name.startswith(f"__{rank}_")}
        return {f"{folder}{name}": self.checkpoint_files[f"{folder}{name}"] for name in
                sorted(wanted) if f"{folder}{name}" in self.checkpoint_files}  # fmt: skip


def complete_checkpoints(listing: Mapping[str, Entry]) -> dict[str, dict[str, Entry]]:
    """The complete checkpoints in a listing, oldest first: {`checkpoints/NAME`: its objects}."""
    found: dict[str, dict[str, Entry]] = {}
    for key in listing:
        if (one := _ONE_FILE.fullmatch(key)) and one[2]:
            name = f"{CHECKPOINTS}/{one[1]}"
            if name in listing:
                found[name] = {name: listing[name], key: listing[key]}
        elif (sharded := _SHARDED.fullmatch(key)) and sharded[2] == SHARDED_MARKER:
            folder = f"{CHECKPOINTS}/{sharded[1]}"
            found[folder] = {k: v for k, v in listing.items() if k.startswith(f"{folder}/")}
    return dict(sorted(found.items()))


def checkpoint_objects(listing: Mapping[str, Entry]) -> dict[str, list[str]]:
    """Every checkpoint's objects in a listing, complete or not: {`checkpoints/NAME`: keys}."""
    found: dict[str, list[str]] = {}
    for key in listing:
        if one := _ONE_FILE.fullmatch(key):
            found.setdefault(f"{CHECKPOINTS}/{one[1]}", []).append(key)
        elif sharded := _SHARDED.fullmatch(key):
            found.setdefault(f"{CHECKPOINTS}/{sharded[1]}", []).append(key)
    return found


def snapshot_of(listing: Mapping[str, Entry]) -> Snapshot:
    """The Snapshot a listing of a run's prefix makes (pure)."""
    complete = complete_checkpoints(listing)
    newest = next(reversed(complete), None)
    run_files = {
        key: entry for key, entry in listing.items()
        if not key.startswith(f"{CHECKPOINTS}/") and not _LOCAL_ONLY.search(key)
    }  # fmt: skip
    return Snapshot(
        run_files=run_files,
        checkpoint=newest,
        checkpoint_files=complete[newest] if newest else {},
        complete=list(complete),
    )


def stale(listing: Mapping[str, Entry], keep_last: int) -> list[str]:
    """The objects a prune deletes, markers first: every checkpoint but the newest `keep_last`
    complete ones and the incomplete ones newer than them (an upload still to finish)."""
    complete = list(complete_checkpoints(listing))
    kept = set(complete[-keep_last:]) if keep_last > 0 else set(complete)
    newest = complete[-1] if complete else ""
    doomed: list[str] = []
    for name, keys in sorted(checkpoint_objects(listing).items()):
        if name in kept or name > newest:
            continue
        # The marker goes first: a half-deleted checkpoint must never look complete.
        doomed.extend(sorted(keys, key=lambda key: not _is_marker(key)))
    return doomed


def _is_marker(key: str) -> bool:
    return key.endswith(".sha256") or key.endswith(f"/{SHARDED_MARKER}")


class Mirror:
    """One process's view of a run prefix and the node's working copy of it."""

    def __init__(self, location: Location, root: Path, store: Store) -> None:
        self.location, self.root, self.store = location, root, store
        # (size, mtime_ns) of each run file as last uploaded by this process.
        self._pushed: dict[str, tuple[int, int]] = {}

    @classmethod
    def for_url(
        cls, url: str, env: Mapping[str, str], *, timeouts: Timeouts = RUN
    ) -> Mirror | None:
        """The Mirror of an s3:// URL (None for a file path); the URL must be checked already."""
        found = parse(url)
        if found is None:
            return None
        return cls(found, working_copy(found, env), Store(found, timeouts=timeouts))

    def snapshot(self) -> Snapshot:
        """One listing of the prefix: the run's files and its newest complete checkpoint."""
        return snapshot_of(self.store.list())

    def fetch(self, files: Mapping[str, Entry]) -> None:
        """Make the working copy hold these objects as the store has them.

        Each is downloaded unless this node already has that version (its ETag); the
        processes of one node take turns, so each file crosses the network once per node.
        """
        if not files:
            return
        with self._node_lock():
            fetched = self._fetched()
            for relative, entry in sorted(files.items()):
                local = self.root / relative
                if fetched.get(relative) == entry.etag and _size(local) == entry.size:
                    continue
                self.store.download(relative, local)
                fetched[relative] = entry.etag
                self._save_fetched(fetched)

    def keep_only(self, checkpoint: str | None) -> None:
        """Drop every local checkpoint but `checkpoint`: the store decides what a run resumes."""
        folder = self.root / CHECKPOINTS
        if not folder.is_dir():
            return
        keep = {Path(checkpoint).name, f"{Path(checkpoint).name}.sha256"} if checkpoint else set()
        with self._node_lock():
            for path in folder.iterdir():
                if path.name in keep or not path.name.startswith(("step-", ".step-", "latest")):
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def upload(self, relatives: list[str]) -> None:
        """Upload working-copy files, in this order (a marker goes last)."""
        for relative in relatives:
            self.store.upload(self.root / relative, relative)

    def push_run_files(self) -> list[str]:
        """Upload the run's files (not checkpoints) changed since this process last pushed them."""
        changed = []
        for path in sorted(self.root.rglob("*")):
            relative = path.relative_to(self.root).as_posix()
            if not path.is_file() or path.is_symlink() or _LOCAL_ONLY.search(relative):
                continue
            stat = path.stat()
            if self._pushed.get(relative) != (stat.st_size, stat.st_mtime_ns):
                self.store.upload(path, relative)
                self._pushed[relative] = (stat.st_size, stat.st_mtime_ns)
                changed.append(relative)
        return changed

    def prune(self, keep_last: int) -> list[str]:
        """Delete checkpoints beyond the newest `keep_last` complete ones; the keys deleted."""
        doomed = stale(self.store.list(f"{CHECKPOINTS}/"), keep_last)
        self.store.delete(doomed)
        return doomed

    def local(self, relative: str) -> Path:
        """Where a relative path lives in the working copy."""
        return self.root / relative

    def relative(self, path: Path) -> str:
        """A working-copy path, relative to its root (POSIX separators)."""
        return path.relative_to(self.root).as_posix()

    @contextlib.contextmanager
    def _node_lock(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _fetched(self) -> dict[str, str]:
        try:
            data = json.loads((self.root / _FETCHED).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _save_fetched(self, fetched: Mapping[str, str]) -> None:
        temp = self.root / f"{_FETCHED}.{os.getpid()}.tmp"
        temp.write_text(json.dumps(dict(fetched), sort_keys=True))
        os.replace(temp, self.root / _FETCHED)


def note_source(folder: Path, url: str) -> None:
    """Mark `folder` as the working copy of `url` (what `push_if_stored` looks for)."""
    note = folder / SOURCE
    if note.is_file() and note.read_text().strip() == url:
        return
    folder.mkdir(parents=True, exist_ok=True)
    temp = note.with_name(f"{SOURCE}.{os.getpid()}.tmp")
    temp.write_text(url + "\n")
    os.replace(temp, note)


def push_if_stored(path: Path) -> str | None:
    """Upload a file just written in a run's working copy at once (a bad-node record, hang
    evidence): the URL it went to, or None for a file in no working copy.

    For files written on the way out: short timeouts, so a dead store costs seconds, and
    StorageError says why it failed.
    """
    for folder in path.parents:
        note = folder / SOURCE
        if note.is_file():
            found = parse(note.read_text().strip())
            if found is None:
                return None
            relative = path.relative_to(folder).as_posix()
            Store(found, timeouts=PROBE).upload(path, relative)
            return found.child(relative).url
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1
