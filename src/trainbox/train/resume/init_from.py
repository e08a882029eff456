"""`train.init_from`: a new run's weights from another run's checkpoint, under a prefix.

Under DDP every rank reads the one-file checkpoint and loads it into its whole model. Under
fsdp the model is sharded already and every rank calls `init_sharded` together. From a
one-file (DDP) checkpoint only rank 0 reads the file; each tensor then goes to every rank by
broadcast and each keeps its shard (DDP's every-rank read would be a read storm on the shared
filesystem at thousands of ranks; here the file is read once). From a sharded
checkpoint every rank reads only the pieces of the saved shards that overlap its own, at any
world size, as a resume does. Either way rank 0 alone judges whether the weights fit and tells
the others, so every rank raises the same error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from trainbox.checkpoint import schema, shards
from trainbox.distributed import consensus
from trainbox.errors import UsageError

INIT_HINT = (
    "point train.init_from at a run_dir or checkpoint of a matching model; use"
    " train.init_prefix to take a submodule's tensors, train.init_strict=false to allow gaps"
)


def read_init_weights(source: str) -> tuple[Path, Mapping[str, Any]]:
    """The checkpoint `source` names (a run_dir: its newest valid one) and its model weights."""
    path = Path(source)
    try:
        if not path.is_dir():
            return path, schema.load(path).model
        found = schema.newest(path / "checkpoints" if (path / "checkpoints").is_dir() else path)
    except (OSError, ValueError) as err:
        raise UsageError(f"train.init_from={source!r}: {err}", hint=INIT_HINT) from err
    if found is None:
        raise UsageError(f"train.init_from={source!r} holds no valid checkpoint", hint=INIT_HINT)
    return found[0], found[1].model


def select_weights(weights: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The tensors under `prefix` (a dotted module path), with the prefix stripped."""
    if not prefix:
        return dict(weights)
    head = prefix if prefix.endswith(".") else f"{prefix}."
    return {key[len(head) :]: value for key, value in weights.items() if key.startswith(head)}


def init_weights(module: torch.nn.Module, *, source: str, prefix: str, strict: bool) -> Path:
    """Load the selected weights into `module` (on every rank alike); the checkpoint used."""
    path, weights = read_init_weights(source)
    names, problems = plan_load(module.state_dict(), weights, where=str(path), prefix=prefix,
                                strict=strict)  # fmt: skip
    if problems:
        raise UsageError(problems, hint=INIT_HINT)
    module.load_state_dict({name: weights[saved] for name, saved in names.items()}, strict=strict)
    return path


def init_sharded(
    module: torch.nn.Module, *, source: str, prefix: str, strict: bool, rank: int, world_size: int
) -> Path:
    """Load `source`'s weights (under `prefix`) into the sharded `module`; the checkpoint used."""
    folder = sharded_source(Path(source), rank=rank, world_size=world_size)
    if folder is None:
        return _from_file(module, source=source, prefix=prefix, strict=strict, rank=rank)
    return _from_shards(module, folder, prefix=prefix, strict=strict, rank=rank)


def shard_candidates(path: Path) -> list[Path]:
    """The sharded checkpoints `path` may mean, newest first: itself if it is one, else those
    of a run_dir (or its checkpoints folder). [] when it names none: a one-file checkpoint."""
    if not path.is_dir():
        return []
    if shards.PATTERN.fullmatch(path.name) or (path / shards.MANIFEST).exists():
        return [path]
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    return list(reversed(shards.existing(folder)))


def sharded_source(path: Path, *, rank: int, world_size: int) -> Path | None:
    """The newest whole sharded checkpoint `path` names, or None if it names none. Collective:
    rank 0 lists the folder, every rank checks its share of each candidate's files."""
    candidates: list[Path] = consensus.from_rank0(shard_candidates(path) if rank == 0 else None)
    reasons = []
    for candidate in candidates:
        reason = shards.check(candidate, rank=rank, world_size=world_size)
        if reason is None:
            return candidate
        reasons.append(reason)
    if reasons:
        raise UsageError(
            f"train.init_from={str(path)!r} holds no valid checkpoint ({'; '.join(reasons)})",
            hint=INIT_HINT,
        )
    return None


def plan_load(
    model: Mapping[str, Any], saved: Mapping[str, Any], *, where: str, prefix: str, strict: bool
) -> tuple[dict[str, str], list[str]]:
    """({model name: saved name} to load, why the weights do not fit): pure, on rank 0.

    `model` and `saved` need only shapes (a sharded model's DTensors give the full ones).
    """
    chosen = select_weights(saved, prefix)
    found = schema.misfits(model, chosen, strict=strict)
    if found:
        at = where + (f" under prefix {prefix!r}" if prefix else "")
        return {}, [f"train.init_from {at} does not fit the model", *found]
    head = "" if not prefix else prefix if prefix.endswith(".") else f"{prefix}."
    return {name: f"{head}{name}" for name in chosen if name in model}, []


def _agreed(verdict: tuple[str, dict[str, str], list[str]] | None) -> tuple[Path, dict[str, str]]:
    """Rank 0's (checkpoint, names to load, problems) on every rank; raises its problems."""
    path, names, problems = consensus.from_rank0(verdict)
    if problems:
        raise UsageError(problems, hint=INIT_HINT)
    return Path(path), names


def _from_file(
    module: torch.nn.Module, *, source: str, prefix: str, strict: bool, rank: int
) -> Path:
    """Rank 0 reads the one-file checkpoint; each tensor is broadcast and sharded on arrival."""
    weights: Mapping[str, Any] = {}
    verdict = None
    if rank == 0:
        try:
            path, weights = read_init_weights(source)
            names, problems = plan_load(module.state_dict(), weights, where=str(path),
                                        prefix=prefix, strict=strict)  # fmt: skip
            verdict = (str(path), names, problems)
        except UsageError as err:
            verdict = ("", {}, err.problems)
    path, names = _agreed(verdict)
    chosen = {name: weights[saved] for name, saved in names.items()} if rank == 0 else {}
    # The rank-0 copy is one full tensor at a time on the other ranks, never the whole model.
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
    set_model_state_dict(module, chosen, options=options)
    return path


def _from_shards(
    module: torch.nn.Module, folder: Path, *, prefix: str, strict: bool, rank: int
) -> Path:
    """Every rank reads the pieces of the saved shards that its own shards need."""
    verdict = None
    if rank == 0:
        try:
            layout = shards.model_layout(folder, torch.device("meta"))
            names, problems = plan_load(module.state_dict(), layout, where=str(folder),
                                        prefix=prefix, strict=strict)  # fmt: skip
            verdict = (str(folder), names, problems)
        except ValueError as err:
            verdict = (str(folder), {}, [f"train.init_from={str(folder)!r}: {err}"])
    path, names = _agreed(verdict)
    ours = get_model_state_dict(module)
    wanted = {shards.MODEL: {saved: ours[name] for name, saved in names.items()}}
    try:
        shards.load_tensors(path, wanted)
    # DCP gathers every rank's failure into one CheckpointException, a BaseException.
    except (Exception, CheckpointException) as err:
        raise UsageError(
            f"train.init_from {path} cannot be read: {' '.join(str(err).split())[:300]}",
            hint=INIT_HINT,
        ) from err
    loaded = {name: wanted[shards.MODEL][saved] for name, saved in names.items()}
    set_model_state_dict(module, loaded, options=StateDictOptions(strict=strict))
    return path
