"""`trainbox hang RUN_DIR`: the stacks a hung job left in RUN_DIR/hang/, in a few lines."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from trainbox.commands.command import Command
from trainbox.distributed.flight_recorder import FILE_PREFIX
from trainbox.errors import UsageError
from trainbox.storage import reading
from trainbox.watchdog import EVIDENCE_DIR
from trainbox.watchdog.hang_report import summarize


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print who was stuck, what each group of ranks was doing, and where their stacks part."""
    # A run kept in a store: its files (not its checkpoints) are fetched to read them here.
    folder = Path(reading.localise(args.run_dir, env, what="RUN_DIR", checkpoint=False))
    folder = folder / EVIDENCE_DIR
    if not folder.is_dir():
        raise UsageError(
            f"{folder} does not exist: no hang was recorded in {args.run_dir}",
            hint="give the run_dir of a job that ended with exit 4 for a hang",
        )
    texts = {
        path.name: path.read_text(errors="replace") for path in sorted(folder.glob("rank-*.txt"))
    }
    print("\n".join(summarize(texts)))
    print(f"each rank's full stacks: {folder}/rank-NNNNN.txt")
    dumps = list(folder.glob(f"{FILE_PREFIX}*"))
    if dumps:
        # NCCL's own record of each rank's collectives (on nccl only; see flight_recorder.py).
        print(
            f"NCCL Flight Recorder dumps from {len(dumps)} rank(s); to match their collectives:"
            f" torchfrtrace {folder} -p {FILE_PREFIX}"
        )
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="the run_dir of a job that ended with exit 4"
    )


COMMAND = Command(
    name="hang", arguments=_arguments, handler=main, overrides=False,
    help="say which rank a hung job waited on, and where each rank's code was",
)  # fmt: skip
