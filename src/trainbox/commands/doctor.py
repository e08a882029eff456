"""`trainbox doctor`: the launch context, preflight and CPU plan, as text or one JSON line."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping

from trainbox import bootstrap, config, doctor
from trainbox.commands import launching
from trainbox.errors import PreflightError


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print what doctor found; exit 3 when preflight found something fatal."""
    settings = config.load(args.config, args.overrides)
    prepared = launching.prepare(env, settings, whole_node=True)
    data = doctor.findings(prepared)
    # One line: several ranks printing to one stream (srun, mpirun) never split an object.
    print(json.dumps(data, separators=(",", ":")) if args.json else doctor.render(data))
    return preflight_exit(prepared)


def preflight_exit(prepared: bootstrap.StartupFacts) -> int:
    """Doctor's exit code: 3 when preflight found something fatal, as `run` would stop."""
    return PreflightError.exit_code if prepared.preflight.fatal else 0
