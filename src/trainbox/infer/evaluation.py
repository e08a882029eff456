"""`trainbox eval`: a checkpoint's validation metrics, sharded exactly over every rank."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainbox import atomic
from trainbox.config import Config
from trainbox.distributed import consensus
from trainbox.distributed.consensus import Problem
from trainbox.distributed.process_group import Session
from trainbox.errors import StorageError, UsageError
from trainbox.infer import locate, model
from trainbox.logs import log
from trainbox.train.data import workers
from trainbox.train.data.map_style import eval_batch_count, eval_loader
from trainbox.train.evaluate import eval_step, evaluate
from trainbox.train.steps.functions import Step


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalRequest:
    """What `trainbox eval` was asked for."""

    # The checkpoint file (or `latest` link) to evaluate.
    checkpoint: Path
    # Where rank 0 writes the result as JSON; None: print only.
    output: Path | None = None
    # Replace an existing output file.
    force: bool = False


def run(config: Config, here: Session, request: EvalRequest) -> dict[str, Any]:
    """Evaluate on every rank, each its share of batches, none twice; the whole-set result."""
    problems = []
    if here.rank0 and request.output is not None:
        problems += locate.destination_problems(request.output, force=request.force)
    step = _step(config, problems)
    # A user's eval step takes its own batches apart: the built-in probe would not fit them.
    loaded = model.load(
        config,
        request.checkpoint,
        split="val",
        device=here.device,
        problems=problems,
        probe=not config.train.eval_step,
    )
    consensus.raise_together(problems)
    assert loaded is not None  # no rank had a problem, so this one loaded
    # Whole batches without padding: a DistributedSampler's repeated samples never count.
    loader = eval_loader(
        loaded.dataset,
        rank=here.context.rank,
        world_size=here.context.world_size,
        batch_size=config.train.batch_size,
        num_workers=model.loader_workers(here, loaded.max_workers, config.pinning),
        stuck_after_s=workers.stuck_after(config.dist.timeout_s),
    )
    metrics = evaluate(
        loaded.model,
        loader,
        step=step,
        device=here.device,
        autocast=model.autocast(config.train.amp, here.device),
        slots=eval_batch_count(
            len(loaded.dataset),
            batch_size=config.train.batch_size,
            world_size=here.context.world_size,
        ),
    )
    result = {
        "checkpoint": str(loaded.checkpoint),
        "checkpoint_sha256": loaded.sha256,
        "step": loaded.step,
        "split": "val",
        "world_size": here.context.world_size,
        "val_metrics": metrics,
    }
    # Still together: every rank learns whether rank 0's write worked, and exits alike.
    failure = _write(request.output, result) if here.rank0 and request.output else None
    failure = consensus.from_rank0(failure)
    if failure is not None:
        raise StorageError(
            failure,
            hint="free space there or choose another --output; the evaluation itself is done",
        )
    log.info("evaluated", checkpoint=str(loaded.checkpoint), step=loaded.step, **metrics)
    return result


def _step(config: Config, problems: list[Problem]) -> Step:
    """`train.eval_step` (a problem if it cannot be imported; the built-in stands in)."""
    try:
        return eval_step(config.train.eval_step, kind=config.train.loss)
    except UsageError as err:
        problems += [Problem(text=text, hint=err.hint) for text in err.problems]
        return eval_step("", kind=config.train.loss)


def _write(output: Path, result: dict[str, Any]) -> str | None:
    """Rank 0: the result as JSON in `output`; what failed, or None."""
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(output, text)
    except OSError as err:
        return f"could not write --output {str(output)!r}: {err.strerror or err}"
    return None
