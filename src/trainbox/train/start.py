"""Where a run starts: run_dir taken, the checkpoint to resume from restored (or init_from's
weights loaded), metrics.jsonl cut back to that step, the manifest written. Collective."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainbox.config import Config
from trainbox.launch.context import LaunchContext
from trainbox.logs import log
from trainbox.train import runfiles
from trainbox.train.agreement import all_ok
from trainbox.train.resume import resume
from trainbox.train.rundir import RunDir
from trainbox.train.seams import Seams
from trainbox.train.state import TrainState


@dataclass(frozen=True, kw_only=True, slots=True)
class Start:
    """How this run begins."""

    # The summary of a run found already complete: nothing to train, return it as it is.
    done: dict[str, Any] | None = None
    # Whether a checkpoint was restored (its step's checkpoint exists: not saved again).
    resumed: bool = False
    # The last logged loss of a run killed after its final checkpoint (only its end is redone).
    last_loss: float | None = None
    # Samples per optimizer step over all ranks.
    global_batch: int = 0


def start(
    config: Config,
    state: TrainState,
    *,
    run_dir: RunDir,
    context: LaunchContext,
    device: torch.device,
    metrics: runfiles.MetricsFile,
    seams: Seams,
    amp_dtype: torch.dtype | None,
) -> Start:
    """Take run_dir, resume or initialise `state`, and bring run_dir's files in line with it."""
    run_dir.prepare()
    found = resume(
        config,
        state,
        directory=run_dir.path / "checkpoints",
        rank=context.rank,
        world_size=context.world_size,
    )
    source = str(found.path) if found else None
    initialised_from = state.begin(found.payload if found else None, source=source or "")
    at_end = found is not None and state.step >= config.train.max_steps
    if at_end and (done := already_complete(run_dir, context, device, step=state.step)):
        return Start(done=done, resumed=True)
    # Nothing in run_dir changes before this point but the lock and damaged files set aside.
    metrics.keep_until(state.step, redo_eval=at_end)
    if context.rank == 0:
        runfiles.write_manifest(
            run_dir.path,
            config,
            context=context,
            device=device,
            user_code=seams.describe(),
            initialised_from=initialised_from,
            resumed_from=source,
        )
    train = config.train
    global_batch = train.batch_size * context.world_size * train.grad_accum
    log.info(
        "training",
        start_step=state.step,
        max_steps=train.max_steps,
        batch_per_process=train.batch_size,
        global_batch=global_batch,
        peak_lr=state.peak_lr,
        device=str(device),
        amp=str(amp_dtype) if amp_dtype else "off",
    )
    last_loss = metrics.last_loss() if at_end else None
    return Start(resumed=found is not None, last_loss=last_loss, global_batch=global_batch)


def already_complete(
    run_dir: RunDir, context: LaunchContext, device: torch.device, *, step: int
) -> dict[str, Any] | None:
    """A run resumed at its end with its summary: left alone, and what to return.

    None: killed after its last checkpoint but before the summary, so the end is redone.
    Rank 0 decides (only it has the files); one all-reduce tells the rest.
    """
    summary = runfiles.read_summary(run_dir.path) if context.rank == 0 else {}
    if not all_ok(summary is not None, device):
        return None
    log.warning(
        "run already complete: nothing to train, its files are left as they are",
        step=step,
        summary=str(run_dir.path / runfiles.SUMMARY),
    )
    return {"steps": step, "val_metrics": {}, **(summary or {}), "already_complete": True}
