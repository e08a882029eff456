"""Resuming: find the checkpoint `train.resume` asks for, judge it against this run's config and
model, agree on every rank, set damaged files aside, restore. Nothing is written before agreeing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainbox.checkpoint import files, schema
from trainbox.checkpoint.schema import Payload
from trainbox.config import Config, as_dict
from trainbox.logs import log
from trainbox.train import resume_policy
from trainbox.train.agreement import Problem, raise_any
from trainbox.train.state import TrainState


@dataclass(frozen=True, kw_only=True, slots=True)
class Found:
    """A checkpoint to resume from."""

    # The file (a `latest` link as given).
    path: Path
    # What it holds.
    payload: Payload


@dataclass(frozen=True, kw_only=True, slots=True)
class Search:
    """What looking for a checkpoint came to on this rank."""

    # The checkpoint to resume from, or None to start at step 0.
    found: Found | None
    # Damaged checkpoints passed over (moved aside once every rank agreed).
    damaged: list[Path]
    # Why this run must not start, or None.
    problem: Problem | None


def resume(
    config: Config, state: TrainState, *, directory: Path, rank: int, world_size: int
) -> Found | None:
    """Restore `state` from the checkpoint to resume from (None: a new run, state untouched).

    Collective: every rank searches and judges, and all raise the same UsageError if any
    rank found a problem. train.state_factory's objects are restored later (TrainState.begin).
    """
    search = find(config, directory)
    problem = search.problem
    changed: list[str] = []
    if search.found is not None and problem is None:
        problem, changed = judge(config, state, search.found)
    raise_any(problem)
    if rank == 0 and search.damaged:
        # Out of reach of pruning and of a new save of the same step; never deleted.
        moved = files.move_aside(search.damaged)
        log.warning("damaged checkpoints moved aside", moved=[str(path) for path in moved])
    if search.found is None:
        return None
    found = search.found
    state.restore(
        found.payload, source=str(found.path), changed=changed, rank=rank, world_size=world_size
    )
    log.info("resumed", checkpoint=str(found.path), step=state.step)
    return found


def find(config: Config, directory: Path) -> Search:
    """The checkpoint `train.resume` names: never, auto (the newest valid one) or a file."""
    wanted = config.train.resume
    if wanted not in ("never", "auto"):
        try:
            return Search(found=Found(path=Path(wanted), payload=schema.load(Path(wanted))),
                          damaged=[], problem=None)  # fmt: skip
        except (OSError, ValueError) as err:
            wrong = (f"train.resume={wanted!r}: {err}", "name an existing checkpoint file")
            return Search(found=None, damaged=[], problem=wrong)
    scan = files.scan(directory)
    damaged = [path for path, _ in scan.damaged]
    found = None
    if wanted == "auto" and scan.found is not None:
        found = Found(path=scan.found[0], payload=schema.read(scan.found[1]))
    problem: Problem | None = None
    if wanted == "never" and scan.found is not None:
        problem = (
            f"train.resume=never but {directory} already holds checkpoints",
            "use a new run_dir, or train.resume=auto to continue that run",
        )
    if wanted == "auto" and scan.found is None and scan.damaged:
        reasons = "; ".join(reason for _, reason in scan.damaged)
        problem = (
            f"every checkpoint in {directory} is damaged ({reasons})",
            "nothing was changed: recover one if you can, or set train.resume=never to start"
            " from step 0 (the damaged files are then kept in checkpoints/damaged/)",
        )
    return Search(found=found, damaged=damaged, problem=problem)


def judge(config: Config, state: TrainState, found: Found) -> tuple[Problem | None, list[str]]:
    """Whether this run may resume from `found`, and the config keys that changed since."""
    path, payload = found.path, found.payload
    ours = as_dict(config)
    # Checkpoints from before they carried their whole config name only the model's.
    theirs = payload.config or {"model": {}}
    ours = {section: value for section, value in ours.items() if section in theirs}
    changed = resume_policy.changed(theirs, ours)
    refused = resume_policy.judge_resume(theirs, ours)
    if refused and config.train.resume_changes != "allow":
        return (
            f"resuming from {path} would change what the checkpoint was made with:"
            f" {'; '.join(refused)}",
            "set those back, use a new run_dir, or add train.resume_changes=allow to resume"
            " with the new values (docs/training.md); nothing was written",
        ), changed
    if refused:
        log.warning("resuming with a changed config", changes=refused, checkpoint=str(path))
    misfit = schema.misfits(state.module.state_dict(), payload.model)
    if misfit:
        return (
            f"checkpoint {path} does not fit the model: {'; '.join(misfit)}",
            "resume with the model code and model.args it was trained with, or use a new run_dir",
        ), changed
    if missing := payload.missing_state():
        return (
            f"checkpoint {path} holds weights only (no {', '.join(missing)} state to resume)",
            "start a new run_dir with train.init_from pointing at it to train from its weights",
        ), changed
    return None, changed
