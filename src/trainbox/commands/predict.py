"""`trainbox predict`: one prediction per input, in input order, into one CSV or JSONL file."""

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
    """Predict on every rank; rank 0 merges the parts into --output and says what it reused."""

    def compute(settings: config.Config, session: Session, checkpoint: Path) -> dict[str, Any]:
        from trainbox.infer import prediction  # torch loads only now, after pinning

        request = prediction.PredictRequest(
            checkpoint=checkpoint,
            output=Path(args.output),
            split=args.split,
            force=args.force,
            chunk_size=args.chunk_size,
        )
        return prediction.run(settings, session, request)

    job = from_checkpoint.Job(label="prediction", compute=compute, say=line)
    return from_checkpoint.main(args, env, job)


def _arguments(parser: argparse.ArgumentParser) -> None:
    flags.checkpoint_flags(parser)
    parser.add_argument(
        "--output", metavar="FILE", required=True, help="predictions.csv or predictions.jsonl"
    )
    parser.add_argument("--split", choices=("val", "train"), default="val", help="default: val")
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    parser.add_argument(
        "--chunk-size",
        type=flags.positive,
        default=1024,
        metavar="N",
        help="inputs per part file, the unit a rerun can skip (default: 1024)",
    )
    flags.debug_flag(parser)


COMMAND = Command(
    name="predict", arguments=_arguments, handler=main, overrides=True,
    help="one prediction per input, in input order, into one CSV or JSONL file",
)  # fmt: skip


def line(result: Mapping[str, Any]) -> str:
    """Rank 0's line about a finished prediction; parts reused from a killed run, if any."""
    # A first run reuses nothing: "reusing 0 of 2 parts" would only raise the question.
    reused = f", reusing {result['reused']} of {result['chunks']} parts" if result["reused"] else ""
    return (
        f"predicted {result['rows']} rows of the {result['split']} split with"
        f" {Path(result['checkpoint']).name} (step {result['step']}){reused} -> {result['output']}"
    )
