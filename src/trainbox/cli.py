"""The `trainbox` command line; the only place that turns errors into exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trainbox import (
    __version__,
    bootstrap,
    config,
    config_view,
    doctor,
    handoff,
    launch,
    logs,
    preempt,
    run_summary,
    supervise,
)
from trainbox.debug import debug_env
from trainbox.errors import PreflightError, Stopped, TrainboxError, UsageError
from trainbox.infer import locate
from trainbox.infer import problems as problem_list
from trainbox.infer.problems import Problem

CONFIG_EPILOG = """\
config keys: `trainbox config [--config FILE] [key.sub=value ...]` prints every key with its
resolved value and where it came from (default, file or override), without running anything.
Each key is explained in docs/configuration.md."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one trainbox command and return its exit code."""
    parser = _parser()
    # Overrides may come before or after --config; argparse alone keeps only the first run.
    args, extra = parser.parse_known_args(argv)
    if (
        extra
        and args.command in ("run", "doctor", "eval", "predict", "config")
        and all("=" in e and not e.startswith("-") for e in extra)
    ):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    env = dict(os.environ)
    code = _handle(args, env)
    # A stop signal from now on arrives too late to matter: the exit code is decided.
    preempt.settle()
    # In node mode the supervisor learns from this why the worker ended (torchrun cannot say).
    supervise.report(env, code)
    return code


def _handle(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    try:
        _start(args, env)
        return args.handler(args, env)
    except Stopped as err:
        # Not a failure: the work is saved and the scheduler is expected to start us again.
        print(f"trainbox: {err.line()}", file=sys.stderr)
        return err.exit_code
    except TrainboxError as err:
        print(f"trainbox: error: {err.line()}", file=sys.stderr)
        return err.exit_code


def _start(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Logging and the one --config file: each a usage error (exit 2) when it cannot be used."""
    # --debug's log level counts from the first line; its other variables wait for the survey.
    logs.configure({**env, **debug_env(env, gpu=False)} if getattr(args, "debug", False) else env)
    files = getattr(args, "config", None) or []
    if len(files) > 1:
        # A silent "last one wins" trained with half of what was asked for.
        raise UsageError(
            f"--config given {_times(len(files))} ({', '.join(map(repr, files))})",
            hint="give one --config; put the other file's keys in it or pass them as key=value",
        )
    args.config = files[0] if files else None


def _times(count: int) -> str:
    return "twice" if count == 2 else f"{count} times"


def _config_flag(parser: argparse.ArgumentParser, text: str = "YAML config file") -> None:
    # Collected, not overwritten: _start refuses a second file instead of silently keeping one.
    parser.add_argument("--config", metavar="FILE", action="append", help=text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainbox",
        description="Detect the launcher, check the node, run PyTorch DDP the same way everywhere.",
    )
    parser.add_argument("--version", action="version", version=f"trainbox {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser(
        "run",
        help="train (the image's default command)",
        epilog=CONFIG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_flag(train)
    _debug_flag(train)
    train.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    train.set_defaults(handler=_run)

    evaluate = commands.add_parser(
        "eval", help="a checkpoint's validation metrics, sharded exactly over every rank"
    )
    _checkpoint_flags(evaluate)
    evaluate.add_argument("--output", metavar="FILE", help="also write the result as JSON here")
    evaluate.add_argument("--force", action="store_true", help="replace an existing --output")
    _debug_flag(evaluate)
    evaluate.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    evaluate.set_defaults(handler=_eval)

    predict = commands.add_parser(
        "predict", help="one prediction per input, in input order, into one CSV or JSONL file"
    )
    _checkpoint_flags(predict)
    predict.add_argument(
        "--output", metavar="FILE", required=True, help="predictions.csv or predictions.jsonl"
    )
    predict.add_argument("--split", choices=("val", "train"), default="val", help="default: val")
    predict.add_argument("--force", action="store_true", help="replace an existing --output")
    predict.add_argument(
        "--chunk-size",
        type=_positive,
        default=1024,
        metavar="N",
        help="inputs per part file, the unit a rerun can skip (default: 1024)",
    )
    _debug_flag(predict)
    predict.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    predict.set_defaults(handler=_predict)

    doc = commands.add_parser("doctor", help="print the launch context, preflight and CPU plan")
    doc.add_argument("--json", action="store_true", help="print one JSON object")
    _config_flag(doc)
    doc.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    doc.set_defaults(handler=_doctor)

    show = commands.add_parser(
        "config",
        help="print the resolved config, each value marked default, file or override; runs nothing",
        epilog=CONFIG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_flag(show)
    show.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    show.set_defaults(handler=_config)

    run = commands.add_parser(
        "exec",
        help="exec CMD with torchrun-style variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*)",
        usage="trainbox exec [--config FILE] [--debug] -- CMD [ARGS ...]",
    )
    _config_flag(run, "YAML config file (preflight, pinning)")
    _debug_flag(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")
    run.set_defaults(handler=_exec)

    report = commands.add_parser("report", help="draw runs' loss and metric curves to one PNG")
    report.add_argument(
        "run_dir", metavar="RUN_DIR", nargs="+", help="one run, or several to compare"
    )
    report.add_argument(
        "--output",
        metavar="FILE",
        help="PNG path (default: RUN_DIR/report.png; ./report.png for several runs)",
    )
    report.set_defaults(handler=_report)
    return parser


def _debug_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--debug",
        action="store_true",
        help="distributed debugging: TORCH_DISTRIBUTED_DEBUG=DETAIL, NCCL_DEBUG=INFO, ... (unless"
        " already set) and debug log lines",
    )


def _checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        required=True,
        help="a checkpoint file, RUN_DIR/checkpoints/latest, or a run directory (its latest)",
    )
    _config_flag(parser, "YAML config file (default: the run's config.yaml)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _debugging(
    args: argparse.Namespace,
    env: Mapping[str, str],
    prepared: bootstrap.Prepared,
    *,
    ddp_over_gloo: bool = False,
) -> dict[str, str]:
    """The variables --debug adds (none without it); CUDA_LAUNCH_BLOCKING only with a GPU."""
    if not args.debug:
        return {}
    extra = debug_env(env, gpu=bool(prepared.survey.gpus), ddp_over_gloo=ddp_over_gloo)
    kept = sorted(set(debug_env({}, gpu=True)) & env.keys())
    logs.log.info("debugging", set=extra, kept_from_environment=kept)
    return extra


def _gloo(settings: config.Config, prepared: bootstrap.Prepared) -> bool:
    """Whether this job's process group is gloo (dist.choose_backend, without importing torch)."""
    backend = settings.dist.backend
    return backend == "gloo" or (backend == "auto" and not prepared.survey.gpus)


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
    # The trainer wraps the model in DDP.
    extra = _debugging(args, env, prepared, ddp_over_gloo=_gloo(settings, prepared))
    if context.spawns_workers:
        given = ["--config", args.config] if args.config else []
        debug = ["--debug"] if args.debug else []
        argv = [sys.executable, "-m", "trainbox", "run", *given, *debug, *args.overrides]
        # The workers inherit --debug's variables from torchrun's environment.
        target = handoff.plan(
            context,
            argv,
            {**env, **extra},
            python=sys.executable,
            max_restarts=settings.dist.max_restarts,
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
    os.environ.update(extra)  # before torch loads: some of them are read once, at import
    os.environ.update(context.to_env())
    from trainbox.train.run import train  # torch loads only for commands that train

    summary = train(settings, prepared, requests=requests)
    if context.rank == 0:
        run_summary.show(summary, settings.output_dir)
    return 0


def _eval(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    def work(settings: config.Config, prepared: bootstrap.Prepared, checkpoint: Path) -> int:
        from trainbox.infer import evaluation  # torch loads only now, after pinning

        output = Path(args.output) if args.output else None
        request = evaluation.EvalRequest(checkpoint=checkpoint, output=output, force=args.force)
        result = evaluation.run(settings, prepared, request)
        if prepared.context.rank == 0:
            metrics = result["val_metrics"]
            shown = " ".join(
                f"{key}={value:.6g}" for key, value in metrics.items() if key != "val_samples"
            )
            where = f" -> {output}" if output else ""
            print(
                f"evaluated {Path(result['checkpoint']).name} (step {result['step']}) on"
                f" {metrics['val_samples']} samples with {_processes(result['world_size'])}:"
                f" {shown}{where}"
            )
        return 0

    return _infer(args, env, work)


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def _predict(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    def work(settings: config.Config, prepared: bootstrap.Prepared, checkpoint: Path) -> int:
        from trainbox.infer import prediction  # torch loads only now, after pinning

        request = prediction.PredictRequest(
            checkpoint=checkpoint,
            output=Path(args.output),
            split=args.split,
            force=args.force,
            chunk_size=args.chunk_size,
        )
        result = prediction.run(settings, prepared, request)
        if prepared.context.rank == 0:
            print(
                f"predicted {result['rows']} rows of the {result['split']} split with"
                f" {Path(result['checkpoint']).name} (step {result['step']}), reusing"
                f" {result['reused']} of {result['chunks']} parts -> {result['output']}"
            )
        return 0

    return _infer(args, env, work)


def _infer(
    args: argparse.Namespace,
    env: Mapping[str, str],
    work: Callable[[config.Config, bootstrap.Prepared, Path], int],
) -> int:
    """eval and predict: prepared and launched exactly like `run`, then `work` on every rank."""
    checkpoint = locate.checkpoint_path(args.checkpoint)
    output = Path(args.output) if args.output else None
    predict = args.command == "predict"
    # Files first: a usage error is said at once, not after joining the peers.
    _raise_problems(locate.early_problems(checkpoint, output, predict=predict))
    settings, source = locate.settings(checkpoint, args.config, args.overrides)
    prepared = _prepare(env, settings)
    context = prepared.context
    hosts_rank0 = context.rank == 0 or (context.spawns_workers and context.node_rank == 0)
    if hosts_rank0 and output is not None:
        _raise_problems(locate.destination_problems(output, force=args.force))
    logs.log.info("config", source=source or "defaults", checkpoint=str(checkpoint))
    prepared.report.raise_if_fatal()
    # No DDP in eval or predict: DETAIL's collective checks are safe on gloo too.
    extra = _debugging(args, env, prepared)
    if context.spawns_workers:
        argv = [sys.executable, "-m", "trainbox", *_forwarded(args)]
        target = handoff.plan(
            context,
            argv,
            {**env, **extra},
            python=sys.executable,
            max_restarts=settings.dist.max_restarts,
        )
        # No deadline: a stopped prediction simply resumes from its parts when rerun.
        return _supervise(target, deadline_at=None)
    # As in _run: the one place that writes os.environ, before torch loads.
    bootstrap.pin(prepared, os.environ)
    os.environ.update(extra)
    os.environ.update(context.to_env())
    return work(settings, prepared, checkpoint)


def _raise_problems(found: list[Problem]) -> None:
    error = problem_list.combined(found)
    if error is not None:
        raise error


def _forwarded(args: argparse.Namespace) -> list[str]:
    """An eval or predict command line again, for the workers node mode starts."""
    argv = [args.command, "--checkpoint", args.checkpoint]
    for flag, value in (("--config", args.config), ("--output", args.output)):
        if value:
            argv += [flag, value]
    if args.command == "predict":
        argv += ["--split", args.split, "--chunk-size", str(args.chunk_size)]
    argv += [flag for flag, on in (("--force", args.force), ("--debug", args.debug)) if on]
    return [*argv, *args.overrides]


def _report(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    del env
    from trainbox import report

    print(
        report.render([Path(d) for d in args.run_dir], Path(args.output) if args.output else None)
    )
    return 0


def _config(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    del env
    print(config_view.render(config.resolve(args.config, args.overrides)), end="")
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
    # A CPU script's process group is gloo, and most such scripts wrap their model in DDP.
    gloo = not prepared.survey.gpus
    child_env = {**env, **_debugging(args, env, prepared, ddp_over_gloo=gloo)}
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
