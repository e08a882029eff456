"""How a run starts: run_dir taken; the checkpoint `train.resume` asks for found, judged against
this run's config and model, agreed on by every rank and restored, or else `train.init_from`'s
weights loaded; metrics.jsonl cut back to that step; the manifest written. Collective.

Nothing in run_dir is written before every rank has agreed to start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from trainbox.checkpoint import files, schema, shards
from trainbox.checkpoint.schema import Payload
from trainbox.config import Config, as_dict
from trainbox.distributed import consensus
from trainbox.distributed.consensus import Problem, raise_first
from trainbox.launch.context import LaunchContext
from trainbox.logs import log
from trainbox.storage import reading
from trainbox.train.resume import init_from, policy
from trainbox.train.resume.run_dir import (
    SUMMARY,
    RunDir,
    TrainSummary,
    read_summary,
    write_manifest,
)
from trainbox.train.resume.run_store import RunStore
from trainbox.train.resume.state import TrainState
from trainbox.train.steps.user_code import UserCode
from trainbox.train.watch.metrics import MetricsFile


@dataclass(frozen=True, kw_only=True, slots=True)
class StartingPoint:
    """Where a run that has training to do begins."""

    # The checkpoint restored (its step is not saved again), or None: a run from step 0.
    checkpoint: Path | None
    # The last logged loss of a run killed after its final checkpoint (only its end is redone).
    last_loss: float | None


def start_run(
    config: Config,
    state: TrainState,
    *,
    run_dir: RunDir,
    context: LaunchContext,
    device: torch.device,
    metrics: MetricsFile,
    user_code: UserCode,
    dataloader_workers: int,
    store: RunStore | None = None,
) -> StartingPoint | TrainSummary:
    """Take run_dir, resume or initialise `state`, and bring run_dir's files in line with it.

    A run found already complete returns its summary: nothing to train, its files left alone.
    With run_dir=s3://, `run_dir` is the node's working copy, first brought in line with the store.
    """
    if store is not None:
        store.fetch_for_start()
    run_dir.prepare()
    found = resume(
        config,
        state,
        directory=run_dir.path / "checkpoints",
        rank=context.rank,
        world_size=context.world_size,
    )
    source = str(found.path) if found else None
    initialised_from = (
        None
        if found
        else initialise(state.module, config, rank=context.rank, world_size=context.world_size)
    )
    state.make_user_state(found.payload if found else None, source=source or "")
    at_end = found is not None and state.step >= config.train.max_steps
    if at_end and (done := already_complete(run_dir, context, device, step=state.step)):
        return done
    # Nothing in run_dir changes before this point but the lock and damaged files set aside.
    metrics.keep_until(state.step, redo_eval=at_end)
    if context.rank == 0:
        write_manifest(
            run_dir.path,
            config,
            context=context,
            device=device,
            user_code=user_code.describe(),
            initialised_from=initialised_from,
            resumed_from=source,
            dataloader_workers=dataloader_workers,
        )
    if store is not None:
        store.push_start()
    last_loss = metrics.last_loss() if at_end else None
    return StartingPoint(checkpoint=found.path if found else None, last_loss=last_loss)


def initialise(
    module: torch.nn.Module, config: Config, *, rank: int, world_size: int
) -> str | None:
    """A new run's weights from `train.init_from`, if set: the checkpoint used, or None.

    Collective under fsdp (the model is sharded already).
    """
    wanted = config.train
    if not wanted.init_from:
        return None
    # An s3:// URL: the checkpoint is fetched into this node's working copy first.
    source = reading.localise(wanted.init_from, os.environ, what="train.init_from")
    if wanted.sharded:
        path = init_from.init_sharded(module, source=source, prefix=wanted.init_prefix,
                                      strict=wanted.init_strict, rank=rank,
                                      world_size=world_size)  # fmt: skip
    else:
        # Every rank reads the same file, so the weights agree without a broadcast.
        path = init_from.init_weights(
            module, source=source, prefix=wanted.init_prefix, strict=wanted.init_strict
        )
    log.info("initialised weights", checkpoint=str(path), prefix=wanted.init_prefix)
    return str(path)


def already_complete(
    run_dir: RunDir, context: LaunchContext, device: torch.device, *, step: int
) -> TrainSummary | None:
    """A run resumed at its end with its summary: left alone, and its summary returned.

    None: killed after its last checkpoint but before the summary, so the end is redone.
    Rank 0 decides (only it has the files); one all-reduce tells the rest.
    """
    record = read_summary(run_dir.path) if context.rank == 0 else {}
    if not consensus.all_ok(record is not None, device):
        return None
    log.warning(
        "run already complete: nothing to train, its files are left as they are",
        step=step,
        summary=str(run_dir.path / SUMMARY),
    )
    return TrainSummary.from_record({"steps": step, **(record or {})}, already_complete=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumePoint:
    """A checkpoint to resume from."""

    # The file (a `latest` link as given).
    path: Path
    # What it holds.
    payload: Payload


@dataclass(frozen=True, kw_only=True, slots=True)
class Search:
    """What looking for a checkpoint came to on this rank."""

    # The checkpoint to resume from, or None to start at step 0.
    found: ResumePoint | None
    # Damaged checkpoints passed over (moved aside once every rank agreed).
    damaged: list[Path]
    # Why this run must not start, or None.
    problem: Problem | None


def resume(
    config: Config, state: TrainState, *, directory: Path, rank: int, world_size: int
) -> ResumePoint | None:
    """Restore `state` from the checkpoint to resume from (None: a new run, state untouched).

    Collective: every rank searches and judges, and all raise the same UsageError if any
    rank found a problem. train.state_factory's objects are restored later
    (TrainState.make_user_state).
    """
    if config.train.sharded:
        search = find_shards(config, directory, rank=rank, world_size=world_size)
    else:
        search = find(config, directory)
    problem = search.problem
    changed: list[str] = []
    if search.found is not None and problem is None:
        problem, changed = check_resume_point(config, state, search.found)
    raise_first(problem)
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
        wanted = reading.localise(wanted, os.environ, what="train.resume")
        try:
            return Search(found=ResumePoint(path=Path(wanted), payload=schema.load(Path(wanted))),
                          damaged=[], problem=None)  # fmt: skip
        except (OSError, ValueError) as err:
            wrong = Problem(
                text=f"train.resume={wanted!r}: {err}", hint="name an existing checkpoint file"
            )
            return Search(found=None, damaged=[], problem=wrong)
    if (other := _other_kind(config, directory)) is not None:
        return Search(found=None, damaged=[], problem=other)
    scan = files.scan(directory)
    damaged = [path for path, _ in scan.damaged]
    found = None
    if wanted == "auto" and scan.found is not None:
        try:
            found = ResumePoint(path=scan.found[0], payload=schema.read_file(*scan.found))
        except ValueError as err:
            # It loads, so it is not damaged, but not the trainer's either: nothing is moved.
            wrong = Problem(
                text=f"{directory}: {err}",
                hint="move that file out of the run's checkpoints, or use a new run_dir",
            )
            return Search(found=None, damaged=damaged, problem=wrong)
    problem: Problem | None = None
    if wanted == "never" and scan.found is not None:
        problem = Problem(
            text=f"train.resume=never but {directory} already holds checkpoints",
            hint="use a new run_dir, or train.resume=auto to continue that run",
        )
    if wanted == "auto" and scan.found is None and scan.damaged:
        reasons = "; ".join(reason for _, reason in scan.damaged)
        problem = Problem(
            text=f"every checkpoint in {directory} is damaged ({reasons})",
            hint="nothing was changed: recover one if you can, or set train.resume=never to start"
            " from step 0 (the damaged files are then kept in checkpoints/damaged/)",
        )
    return Search(found=found, damaged=damaged, problem=problem)


def _other_kind(config: Config, directory: Path, path: Path | None = None) -> Problem | None:
    """A run reads only its own strategy's kind of checkpoint: one file (ddp) or shards (fsdp)."""
    sharded = config.train.sharded
    if path is not None:
        other = path.is_dir() != sharded
        where = str(path)
    else:
        other = bool((files if sharded else shards).existing(directory))
        where = f"{directory} holds"
    if not other:
        return None
    theirs = "DDP's one-file checkpoints" if sharded else "fsdp's sharded checkpoints"
    return Problem(
        text=f"train.strategy={config.train.strategy} but {where}"
        f" {'is one of ' if path is not None else ''}{theirs}",
        hint="resume with the train.strategy the run was started with, or use a new run_dir",
    )


def find_shards(config: Config, directory: Path, *, rank: int, world_size: int) -> Search:
    """`find` for fsdp's sharded checkpoints. Collective: every rank checks its share."""
    wanted = config.train.resume
    if wanted not in ("never", "auto"):
        wanted = reading.localise(wanted, os.environ, what="train.resume")
        path = Path(wanted)
        problem = _other_kind(config, directory, path) if path.exists() else None
        reason = None if problem else shards.check(path, rank=rank, world_size=world_size)
        if problem is None and reason is None:
            try:
                point = _shard_point(path)
                return Search(found=point, damaged=[], problem=None)
            except ValueError as err:
                reason = str(err)
        problem = problem or Problem(
            text=f"train.resume={wanted!r}: {reason}", hint="name an existing sharded checkpoint"
        )
        return Search(found=None, damaged=[], problem=problem)
    if (problem := _other_kind(config, directory)) is not None:
        return Search(found=None, damaged=[], problem=problem)
    damaged: list[tuple[Path, str]] = []
    found = None
    # As for one-file checkpoints, `never` looks too: damaged ones are then moved aside.
    for path in reversed(shards.existing(directory)):
        reason = shards.check(path, rank=rank, world_size=world_size)
        if reason is None:
            try:
                found = _shard_point(path)
                break
            except ValueError as err:
                reason = str(err)
        log.warning("skipping damaged checkpoint", checkpoint=str(path), reason=reason)
        damaged.append((path, reason))
    return _judged_search(config, directory, found, damaged)


def _shard_point(path: Path) -> ResumePoint:
    """A checked sharded checkpoint's record as a ResumePoint; ValueError: not the trainer's."""
    return ResumePoint(path=path, payload=schema.read_file(path, shards.read_record(path)))


def _judged_search(
    config: Config, directory: Path, found: ResumePoint | None, damaged: list[tuple[Path, str]]
) -> Search:
    """The Search for what was found, with `never`'s and all-damaged's refusals."""
    wanted, problem = config.train.resume, None
    if wanted == "never" and found is not None:
        problem = Problem(
            text=f"train.resume=never but {directory} already holds checkpoints",
            hint="use a new run_dir, or train.resume=auto to continue that run",
        )
    elif wanted == "auto" and found is None and damaged:
        problem = Problem(
            text=f"every checkpoint in {directory} is damaged"
            f" ({'; '.join(reason for _, reason in damaged)})",
            hint="nothing was changed: recover one if you can, or set train.resume=never to start"
            " from step 0 (the damaged files are then kept in checkpoints/damaged/)",
        )
    return Search(found=found, damaged=[path for path, _ in damaged], problem=problem)


def check_resume_point(
    config: Config, state: TrainState, found: ResumePoint
) -> tuple[Problem | None, list[str]]:
    """Whether this run may resume from `found`, and the config keys that changed since."""
    path, payload = found.path, found.payload
    ours = as_dict(config)
    # Checkpoints from before they carried their whole config name only the model's.
    theirs = payload.config or {"model": {}}
    ours = {section: value for section, value in ours.items() if section in theirs}
    changed = policy.changed(theirs, ours)
    refused = policy.judge_resume(theirs, ours)
    if refused and config.train.resume_changes != "allow":
        return Problem(
            text=f"resuming from {path} would change what the checkpoint was made with:"
            f" {'; '.join(refused)}",
            hint="set those back, use a new run_dir, or add train.resume_changes=allow to resume"
            " with the new values (docs/training.md); nothing was written",
        ), changed
    if refused:
        log.warning("resuming with a changed config", changes=refused, checkpoint=str(path))
    # A sharded checkpoint's tensors are checked by the load itself (DCP names any misfit).
    misfit = [] if payload.sharded else schema.misfits(state.module.state_dict(), payload.model)
    if misfit:
        return Problem(
            text=f"checkpoint {path} does not fit the model: {'; '.join(misfit)}",
            hint="resume with the model code and model.args it was trained with, or use a new"
            " run_dir",
        ), changed
    if missing := payload.missing_state():
        return Problem(
            text=f"checkpoint {path} holds weights only (no {', '.join(missing)} state to resume)",
            hint="start a new run_dir with train.init_from pointing at it to train from its"
            " weights",
        ), changed
    return None, changed
