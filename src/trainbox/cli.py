"""The `trainbox` command line; the only place that turns errors into exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainbox import __version__, bootstrap, config, doctor, handoff, logs, preempt, supervise
from trainbox.errors import PreflightError, Stopped, TrainboxError, UsageError


def main(argv: Sequence[str] | None = None) -> int:
    """Run one trainbox command and return its exit code."""
    parser = _parser()
    # Overrides may come before or after --config; argparse alone keeps only the first run.
    args, extra = parser.parse_known_args(argv)
    if (
        extra
        and args.command in ("run", "doctor")
        and all("=" in e and not e.startswith("-") for e in extra)
    ):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    env = dict(os.environ)
    logs.configure(env)
    code = _handle(args, env)
    # In node mode the supervisor learns from this why the worker ended (torchrun cannot say).
    supervise.report(env, code)
    return code


def _handle(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    try:
        return args.handler(args, env)
    except Stopped as err:
        # Not a failure: the work is saved and the scheduler is expected to start us again.
        print(f"trainbox: {err.line()}", file=sys.stderr)
        return err.exit_code
    except TrainboxError as err:
        print(f"trainbox: error: {err.line()}", file=sys.stderr)
        return err.exit_code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainbox",
        description="Detect the launcher, check the node, run PyTorch DDP the same way everywhere.",
    )
    parser.add_argument("--version", action="version", version=f"trainbox {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("run", help="train (the image's default command)")
    train.add_argument("--config", metavar="FILE", help="YAML config file")
    train.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    train.set_defaults(handler=_run)

    doc = commands.add_parser("doctor", help="print the launch context, preflight and CPU plan")
    doc.add_argument("--json", action="store_true", help="print one JSON object")
    doc.add_argument("--config", metavar="FILE", help="YAML config file")
    doc.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    doc.set_defaults(handler=_doctor)

    run = commands.add_parser(
        "exec",
        help="exec CMD with torchrun-style variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*)",
        usage="trainbox exec [--config FILE] -- CMD [ARGS ...]",
    )
    run.add_argument("--config", metavar="FILE", help="YAML config file (preflight, pinning)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")
    run.set_defaults(handler=_exec)

    report = commands.add_parser("report", help="draw a run's loss and metric curves to a PNG")
    report.add_argument("run_dir", metavar="RUN_DIR")
    report.add_argument("--output", metavar="FILE", help="PNG path (default: RUN_DIR/report.png)")
    report.set_defaults(handler=_report)
    return parser


def _prepare(
    env: Mapping[str, str], settings: config.Config, *, whole_node: bool = False
) -> bootstrap.Prepared:
    prepared = bootstrap.prepare(env, settings, whole_node=whole_node)
    context = prepared.context
    logs.bind(context)
    logs.log.info(
        "launch",
        flavor=context.flavor,
        world_size=context.world_size,
        node_rank=context.node_rank,
        master=f"{context.master_addr}:{context.master_port}",
        spawns_workers=context.spawns_workers,
    )
    for note in context.notes:
        logs.log.warning("launch note", note=note)
    for check in prepared.report.describe():
        if check["status"] in ("warn", "fail"):
            logs.log.warning("preflight", **check)
    return prepared


def _run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    # First thing: a preemption signal during start-up must not kill the process uncounted.
    requests = preempt.Requests()
    requests.install()
    settings = config.load(args.config, args.overrides)
    prepared = _prepare(env, settings)
    prepared.report.raise_if_fatal()
    context = prepared.context
    if context.spawns_workers:
        given = ["--config", args.config] if args.config else []
        argv = [sys.executable, "-m", "trainbox", "run", *given, *args.overrides]
        target = handoff.plan(
            context, argv, env, python=sys.executable, max_restarts=settings.dist.max_restarts
        )
        deadline_at = preempt.deadline(env, margin_s=settings.train.deadline_margin_s)
        if requests.code:
            # Asked to stop before any worker started: nothing new to save.
            raise Stopped(
                f"stopped by {preempt.REASONS[requests.code]} before the workers started",
                hint="run the same command again; it resumes from the newest checkpoint",
            )
        return _supervise(target, deadline_at=deadline_at)
    # The one place that writes os.environ: pinning before torch starts its thread pools, and
    # the torchrun-style variables that env:// and the user's libraries read.
    bootstrap.pin(prepared, os.environ)
    os.environ.update(context.to_env())
    from trainbox.train.run import train  # torch loads only for commands that train

    summary = train(settings, prepared, requests=requests)
    if context.rank == 0:
        metrics = " ".join(f"{key}={value:.4g}" for key, value in summary["val_metrics"].items())
        print(
            f"trained {summary['steps']} steps: {metrics} -> {settings.output_dir / 'summary.json'}"
        )
    return 0


def _report(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    del env
    from trainbox import report

    print(report.render(Path(args.run_dir), Path(args.output) if args.output else None))
    return 0


def _doctor(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    prepared = _prepare(env, config.load(args.config, args.overrides), whole_node=True)
    data = doctor.report(prepared)
    # One line: several ranks printing to one stream (srun, mpirun) never split an object.
    print(json.dumps(data, separators=(",", ":")) if args.json else doctor.render(data))
    return preflight_exit(prepared)


def preflight_exit(prepared: bootstrap.Prepared) -> int:
    """Doctor's exit code: 3 when preflight found something fatal, as `run` would stop."""
    return PreflightError.exit_code if prepared.report.fatal else 0


def _exec(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UsageError("trainbox exec needs a command", hint="trainbox exec -- python train.py")
    settings = config.load(args.config, [])
    prepared = _prepare(env, settings)
    prepared.report.raise_if_fatal()
    child_env = dict(env)
    bootstrap.pin(prepared, child_env)
    target = handoff.plan(
        prepared.context,
        command,
        child_env,
        python=sys.executable,
        max_restarts=settings.dist.max_restarts,
    )
    if prepared.context.spawns_workers:
        # The user's script decides what a signal means; the deadline is for `run` only.
        return _supervise(target, deadline_at=None)
    return _replace_process(target)


def _supervise(target: handoff.Handoff, *, deadline_at: float | None) -> int:
    logs.log.info("starting workers", argv=list(target.argv))
    return supervise.run(target, deadline_at=deadline_at)


def _replace_process(target: handoff.Handoff) -> int:
    logs.log.info("exec", argv=list(target.argv))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(target.argv[0], list(target.argv), target.env)
    except OSError as err:
        raise UsageError(
            f"cannot run {target.argv[0]!r}: {err.strerror}",
            hint="check the command name and that it is on PATH inside the container",
        ) from err
    return 0  # not reached: exec replaced this process
