"""`trainbox exec`: the user's command with torchrun-style variables, pinned, or torchrun's."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from trainbox import bootstrap, config, handoff, launch
from trainbox.commands import launching
from trainbox.errors import UsageError


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Exec CMD in place of this process, or supervise torchrun running it in node mode."""
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UsageError("trainbox exec needs a command", hint="trainbox exec -- python train.py")
    settings = config.load(args.config, [])
    prepared = launching.prepare(env, settings)
    prepared.preflight.raise_if_fatal()
    # A CPU script's process group is gloo, and most such scripts wrap their model in DDP.
    gloo = not prepared.survey.gpus
    child_env = {**env, **launching.debugging(args.debug, env, prepared, ddp_over_gloo=gloo)}
    # The user's command, not trainbox, runs next: it inherits the pinning through its env.
    bootstrap.pin(prepared, child_env)
    target = handoff.plan(
        launch.exported(prepared.context),
        command,
        child_env,
        python=sys.executable,
        max_restarts=settings.dist.max_restarts,
    )
    if prepared.context.spawns_workers:
        # The user's script decides what a signal means; the deadline is for `run` only.
        return launching.supervise_workers(target, deadline_at=None)
    return launching.replace_process(target)
