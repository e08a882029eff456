"""Sharded checkpoints (`train.strategy=fsdp`): a folder per step that every rank writes its
own shards into with torch.distributed.checkpoint (DCP); it counts once it is complete.

    checkpoints/step-00000021.dcp/
        __0_0.distcp ... __{W-1}_0.distcp   each rank's shards of the model and optimizer
        .metadata                          DCP's index of every shard (written by rank 0)
        record.pt                          the rest of the Payload: step, config, schedule, RNG
        manifest.json                      every file's SHA-256 and size; written last

The folder is filled under a hidden temp name and renamed once `manifest.json` is in it, so a
folder named step-*.dcp is whole. `latest` and damaged/ work as for the one-file checkpoints.
Collective functions say so; every rank calls them together. DCP itself is imported only by the
functions that read or write shards: it brings fsdp along, 0.6 CPU-s of every process's start-up,
which eval and predict of a one-file checkpoint never need.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as torch_dist

from trainbox import atomic
from trainbox.checkpoint import files
from trainbox.distributed import consensus
from trainbox.errors import StorageError

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemReader

PATTERN = re.compile(r"step-(\d{8})\.dcp")
MANIFEST = "manifest.json"
RECORD = "record.pt"
# DCP's index of every shard, written by rank 0 (torch's own name for it).
METADATA = ".metadata"
# The key the model's state dict is saved under (train/resume/state.py's sharded_tensors).
MODEL = "model"
_CHUNK_BYTES = 64 << 20


def path_for(directory: Path, step: int) -> Path:
    """Where the sharded checkpoint of `step` lives."""
    return directory / f"step-{step:08d}.dcp"


def existing(directory: Path) -> list[Path]:
    """Sharded checkpoints in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(path for path in directory.iterdir() if PATTERN.fullmatch(path.name))


def save(
    directory: Path,
    step: int,
    tensors: dict[str, Any],
    *,
    record: Mapping[str, Any] | None,
    device: torch.device,
    hook: files.Hook | None = None,
    group: torch_dist.ProcessGroup | None = None,
) -> Path:
    """Write `tensors` (DCP state dicts) as every rank's shards and rank 0's `record`. Collective.

    Each rank writes and hashes only its own files; rank 0 then writes the record, the manifest
    and renames the folder. StorageError on every rank if any rank failed. `hook(point)` runs at
    each of faults.SAVE_POINTS this save passes (`sidecar` is the manifest; rank 0's from there).
    `group`: the process group of every rank to talk over (a background writer's own; `device`
    must suit it), else the default one.
    """
    announce = hook or _ignore
    rank0 = record is not None
    final = path_for(directory, step)
    temp = directory / f".{final.name}.tmp"
    problem = _attempt(f"could not start checkpoint {final}", lambda: _fresh(temp, rank0=rank0))
    _agree(problem, device, final, group)
    announce("open")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(temp), process_group=group)
    except (Exception, CheckpointException) as err:  # every rank's failures, gathered by DCP
        raise StorageError(
            f"could not write the shards of checkpoint {final}: {err}".splitlines()[0],
            hint="check the volume behind run_dir; earlier checkpoints are intact",
        ) from err
    announce("write")
    mine: dict[str, Any] = {}
    problem = _attempt(
        f"could not read back this rank's shards of {final}",
        lambda: mine.update(_hashes(sorted(temp.glob(f"__{torch_dist.get_rank()}_*.distcp")))),
    )
    _agree(problem, device, final, group)
    announce("fsync")
    everyone = consensus.to_rank0(mine, group)
    if everyone is not None and record is not None:
        problem = _attempt(
            f"could not save checkpoint {final}",
            lambda: _seal(temp, final, everyone, record, announce),
        )
    _agree(problem, device, final, group)
    return final


def _fresh(temp: Path, *, rank0: bool) -> None:
    # A killed save of the same step may have left its temp folder.
    if not rank0:
        return
    temp.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()


def _seal(
    temp: Path, final: Path, everyone: list[Any], record: Mapping[str, Any], announce: files.Hook
) -> None:
    """Rank 0: the record, the manifest last, then the rename that makes the checkpoint count."""
    with (temp / RECORD).open("wb") as handle:
        torch.save(dict(record), handle)
        handle.flush()
        os.fsync(handle.fileno())
    listed: dict[str, Any] = {}
    for part in everyone:
        listed.update(part)
    listed.update(_hashes([temp / RECORD, temp / METADATA]))
    atomic.write_json(temp / MANIFEST, {"step": record["step"], "files": listed})
    announce("sidecar")
    if final.exists() and not (final / MANIFEST).exists():
        shutil.rmtree(final)  # an incomplete folder of the same step cannot be used anyway
    os.replace(temp, final)
    announce("rename")
    atomic.fsync_dir(final.parent)
    files.point_latest(final.parent, final)
    announce("latest")


def _ignore(point: str) -> None:
    del point


def _hashes(paths: list[Path]) -> dict[str, dict[str, Any]]:
    return {path.name: {"sha256": sha256(path), "bytes": path.stat().st_size} for path in paths}


def sha256(path: Path) -> str:
    """The file's SHA-256, read in bounded chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _attempt(what: str, action: Callable[[], object]) -> StorageError | None:
    try:
        action()
    except OSError as err:
        return StorageError(
            f"{what}: {err.strerror or err}",
            hint="check the volume behind run_dir; earlier checkpoints are intact",
        )
    return None


def _agree(
    problem: StorageError | None,
    device: torch.device,
    final: Path,
    group: torch_dist.ProcessGroup | None = None,
) -> None:
    if not consensus.all_ok(problem is None, device, group):
        raise problem or StorageError(
            f"another rank could not write its part of checkpoint {final}",
            hint="that rank's log names the file and the reason; earlier checkpoints are intact",
        )


def check(path: Path, *, rank: int, world_size: int) -> str | None:
    """Why the sharded checkpoint at `path` cannot be used, or None when it is whole. Collective.

    Rank 0 reads the manifest and sends it on; rank r checks files r, r + W, ...: every rank
    reads O(1) files however many there are.
    """
    listed = consensus.from_rank0(_listed(path) if rank == 0 else None)
    if isinstance(listed, str):
        return listed
    return consensus.decided_by_rank0(
        _first_mismatch(path, listed[rank::world_size]), _first_reason
    )


def check_alone(path: Path) -> str | None:
    """`check` in one process with no process group: every file, by this process."""
    listed = _listed(path)
    return listed if isinstance(listed, str) else _first_mismatch(path, listed)


def _first_mismatch(path: Path, listed: list[tuple[str, Mapping[str, Any]]]) -> str | None:
    return next((why for name, entry in listed if (why := _mismatch(path / name, entry))), None)


def _listed(path: Path) -> list[tuple[str, Mapping[str, Any]]] | str:
    """The manifest's (file, {sha256, bytes}) pairs in name order, or why there are none."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        return f"{path.name} has no readable {MANIFEST} ({type(err).__name__})"
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or not {RECORD, METADATA} <= set(listed):
        return f"{path.name}/{MANIFEST} does not list the checkpoint's files"
    if not all(isinstance(entry, dict) for entry in listed.values()):
        return f"{path.name}/{MANIFEST} is not a trainbox manifest"
    return sorted(listed.items())


def _mismatch(path: Path, entry: Mapping[str, Any]) -> str | None:
    try:
        if path.stat().st_size != entry.get("bytes") or sha256(path) != entry.get("sha256"):
            return f"{path.parent.name}/{path.name} does not match its checksum"
    except OSError as err:
        return f"{path.parent.name}/{path.name} cannot be read ({err.strerror or err})"
    return None


def _first_reason(reasons: list[str | None]) -> str | None:
    return next((reason for reason in reasons if reason), None)


def read_record(path: Path) -> dict[str, Any]:
    """The checkpoint's record (checked by `check` first); ValueError says why it cannot load."""
    try:
        raw = torch.load(path / RECORD, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a damaged file
        raise ValueError(f"{path.name}/{RECORD} cannot be loaded ({type(err).__name__})") from err
    if not isinstance(raw, dict):
        raise ValueError(f"{path.name}/{RECORD} is not a trainbox checkpoint record")
    return raw


def load_tensors(path: Path, tensors: dict[str, Any]) -> None:
    """Fill `tensors` (DCP state dicts of this rank's shards) from the checkpoint. Collective.

    DCP reads, for each rank, the pieces of the saved shards that overlap its own: any world size.
    """
    import torch.distributed.checkpoint as dcp

    dcp.load(tensors, storage_reader=_reader(path))


def _reader(path: Path) -> FileSystemReader:
    """DCP's reader of the checkpoint at `path` (checkpoint/shard_reader.py, loaded when used)."""
    from trainbox.checkpoint.shard_reader import reader

    return reader(path, manifest=MANIFEST)


def read_model(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Fill full-size `tensors` (a model's state_dict) from the checkpoint's model, in place.

    In this process alone, with or without a process group: DCP reads each tensor's pieces from
    every rank's file. ValueError names what does not fit (a missing key, another shape).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():
            # Alone is what is meant here: DCP warns when no process group is there.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({MODEL: dict(tensors)}, storage_reader=_reader(path), no_dist=True)
    # DCP wraps a failure in CheckpointException, a BaseException.
    except (Exception, CheckpointException) as err:
        raise ValueError(" ".join(str(err).split())[:300]) from err


def model_layout(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """Uninitialised full-size tensors for every model entry of the checkpoint, from its index.

    On the meta device they cost no memory: their shapes check a model against the checkpoint.
    ValueError: the index cannot be read.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = _reader(path).read_metadata()
    except Exception as err:  # a damaged index: pickle and OS errors alike
        raise ValueError(f"{path.name}/{METADATA} cannot be read ({type(err).__name__})") from err
    prefix = f"{MODEL}."
    entries = {
        key.removeprefix(prefix): entry
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith(prefix)
    }
    other = sorted(key for key, entry in entries.items()
                   if not isinstance(entry, TensorStorageMetadata))  # fmt: skip
    if other:
        raise ValueError(f"{path.name} holds model entries that are not tensors: {other[:6]}")
    return {
        key: torch.empty(entry.size, dtype=entry.properties.dtype, device=device)
        for key, entry in entries.items()
        if isinstance(entry, TensorStorageMetadata)
    }


def whole_model(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's model as one state dict of full CPU tensors, in this process alone.

    Memory: the model's full size, plus one saved piece at a time while DCP reads.
    """
    tensors = model_layout(path, torch.device("cpu"))
    read_model(path, tensors)
    return tensors


def prune(directory: Path, keep_last: int, *, hook: files.Hook | None = None) -> None:
    """Rank 0: delete all but the newest `keep_last` (and `latest`'s), and leftover temp folders."""
    announce = hook or _ignore
    pinned = files.latest_name(directory)
    try:
        for path in existing(directory)[:-keep_last]:
            if path.name == pinned:
                continue
            # The manifest goes first: a folder without one is never taken for a checkpoint.
            (path / MANIFEST).unlink(missing_ok=True)
            announce("prune")
            shutil.rmtree(path)
        for leftover in directory.glob(".step-*.dcp.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)
    except OSError as err:
        raise StorageError(
            f"could not delete old checkpoint {err.filename or directory}: {err.strerror or err}",
            hint="check the volume behind run_dir; the newest checkpoints are intact",
        ) from err
