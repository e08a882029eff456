"""`trainbox eval`: a checkpoint's validation metrics, sharded exactly over every rank."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainbox import config
from trainbox.commands import flags
from trainbox.commands.command import Command
from trainbox.runtime import from_checkpoint

if TYPE_CHECKING:
    from trainbox.distributed.process_group import Session


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Evaluate on every rank; rank 0 prints the metrics (and writes --output)."""
    output = Path(args.output) if args.output else None

    def compute(settings: config.Config, session: Session, checkpoint: Path) -> dict[str, Any]:
        from trainbox.infer import evaluation  # torch loads only now, after pinning

        request = evaluation.EvalRequest(checkpoint=checkpoint, output=output, force=args.force)
        return evaluation.run(settings, session, request)

    def say(result: dict[str, Any]) -> str:
        metrics = result["val_metrics"]
        shown = " ".join(
            f"{key}={value:.6g}" for key, value in metrics.items() if key != "val_samples"
        )
        where = f" -> {output}" if output else ""
        return (
            f"evaluated {Path(result['checkpoint']).name} (step {result['step']}) on"
            f" {metrics['val_samples']} samples with {_processes(result['world_size'])}:"
            f" {shown}{where}"
        )

    job = from_checkpoint.Job(label="evaluation", compute=compute, say=say)
    return from_checkpoint.main(args, env, job)


def _arguments(parser: argparse.ArgumentParser) -> None:
    flags.checkpoint_flags(parser)
    parser.add_argument("--output", metavar="FILE", help="also write the result as JSON here")
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    flags.debug_flag(parser)


COMMAND = Command(
    name="eval", arguments=_arguments, handler=main, overrides=True,
    help="a checkpoint's validation metrics, sharded exactly over every rank",
)  # fmt: skip


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"
