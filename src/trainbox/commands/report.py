"""`trainbox report`: runs' loss and metric curves drawn to one PNG."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from trainbox.commands import curves


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Draw each RUN_DIR's metrics.jsonl into one PNG and print where it went."""
    del env
    output = Path(args.output) if args.output else None
    print(curves.render([Path(run_dir) for run_dir in args.run_dir], output))
    return 0
