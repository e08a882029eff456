"""`trainbox exec`: the user's command with torchrun-style variables, pinned, or torchrun's."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence

from trainbox import affinity, config, launch, logs
from trainbox.commands import flags
from trainbox.commands.command import Command
from trainbox.errors import UsageError
from trainbox.process import bootstrap, exec_plan, exit_grace, launching
from trainbox.runtime import exec_handshake

# A config override as `run` takes it (`dist.procs_per_node=2`); a command never looks like one.
_OVERRIDE = re.compile(r"[A-Za-z_][\w.]*=")
USAGE_HINT = "trainbox exec [--config FILE] [key.sub=value ...] -- python train.py"


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Exec CMD in place of this process, or supervise torchrun running it in node mode."""
    overrides, command = split_command(args.cmd)
    settings = config.load(args.config, overrides)
    prepared = for_command(launching.prepare(env, settings), settings)
    prepared.preflight.raise_if_fatal()
    # A CPU script's process group is gloo, and most such scripts wrap their model in DDP.
    gloo = not prepared.survey.gpus
    child_env = {**env, **launching.debugging(args.debug, env, prepared, ddp_over_gloo=gloo)}
    child_env |= exit_grace.exported(child_env, grace_s=settings.dist.exit_grace_s)
    child_env |= launching.compile_cache(env, prepared.context.local_rank)
    # The user's command, not trainbox, runs next: it inherits the pinning through its env.
    launching.pin(prepared, child_env)
    target = exec_plan.plan(
        launch.exported(prepared.context),
        command,
        child_env,
        python=sys.executable,
        max_restarts=settings.dist.max_restarts,
    )
    context = prepared.context
    logs.log.info("exported", **exec_plan.describe(target, context))
    if context.spawns_workers:
        # The user's script decides what a signal means; the deadline is for `run` only.
        return launching.supervise_workers(target, deadline_at=None)
    if exec_handshake.needed(context):
        tag = exec_handshake.job_tag(env, context)
        exec_handshake.meet(context, tag=tag, timeout_s=settings.dist.timeout_s)
    return launching.replace_process(target)


def _arguments(parser: argparse.ArgumentParser) -> None:
    flags.config_flag(parser, "YAML config file (preflight, pinning)")
    flags.debug_flag(parser)
    parser.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="key.sub=value ... -- CMD",
        help="config overrides, as for run, then the command to run after --",
    )


COMMAND = Command(
    # Its overrides are the words before CMD, which split_command reads, not the CLI.
    name="exec", arguments=_arguments, handler=main, overrides=False,
    help="exec CMD with torchrun-style variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*)",
    usage="trainbox exec [--config FILE] [--debug] [key.sub=value ...] -- CMD [ARGS ...]",
)  # fmt: skip


def for_command(
    prepared: bootstrap.StartupFacts, settings: config.Config
) -> bootstrap.StartupFacts:
    """The prepared process with a CPU plan for a command that is not trainbox's own."""
    if prepared.plan is None:
        return prepared
    threads_set = settings.pinning.num_threads != "auto"
    plan = affinity.for_command(prepared.plan, threads_set=threads_set)
    return dataclasses.replace(prepared, plan=plan)


def split_command(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """(config overrides, command) from what follows `exec`: overrides first, then `--`.

    The overrides end at the first word that is not one; a `--` there is dropped, and any later
    `--` belongs to the command (`python train.py -- --lr 1`).
    """
    words = list(words)
    count = next((i for i, word in enumerate(words) if not _OVERRIDE.match(word)), len(words))
    overrides, command = words[:count], words[count:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("trainbox exec needs a command", hint=USAGE_HINT)
    return overrides, command
