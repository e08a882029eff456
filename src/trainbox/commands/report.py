"""`trainbox report`: a run's loss and metric curves drawn to a PNG."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from trainbox import curves


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Draw RUN_DIR's metrics.jsonl and print where the PNG went."""
    del env
    print(curves.render(Path(args.run_dir), Path(args.output) if args.output else None))
    return 0
