"""The `trainbox` command line; the only place that turns errors into exit codes."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Mapping, Sequence

from trainbox import logs
from trainbox.commands import config, doctor, eval, exec, export, hang, predict, report, run
from trainbox.errors import Stopped, TrainboxError, UsageError
from trainbox.process import exit_grace, preempt, supervise
from trainbox.process.debug import debug_env
from trainbox.version import __version__

CONFIG_EPILOG = """\
config keys: `trainbox config [--config FILE] [key.sub=value ...]` prints every key with its
resolved value and where it came from (default, file or override), without running anything.
Each key is explained in docs/configuration.md."""


def program() -> int:
    """The `trainbox` program (console script and `python -m trainbox`): `main`, then an exit
    that leaves the objects still alive out of the interpreter's last collections."""
    code = main(own_process=True)
    # Python's teardown runs full garbage collections over every object still alive: about
    # 300,000 once torch and its compiler stack are imported, 0.7-1.0 CPU-s a process,
    # measured, against 0.15 s frozen. Nothing here needs them: exit hooks still run (sinks
    # drain and close), and what the modules hold is still freed as they are cleared. Only a
    # process that ends here may skip them; main() called in-process freezes nothing.
    gc.freeze()
    return code


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
    """Run one trainbox command and return its exit code; `own_process`: the process ends when
    this returns (the program), so a command may freeze what its start-up made."""
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
    # Node mode's workers run this same command line, unchanged.
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.own_process = own_process
    env = dict(os.environ)
    code = _handle(args, env)
    # A stop signal from now on arrives too late to matter: the exit code is decided.
    preempt.settle()
    # In node mode the supervisor learns from this why the worker ended (torchrun cannot say).
    supervise.record_exit_code(env, code)
    # A thread still inside a collective would abort the interpreter's teardown (SIGABRT).
    exit_grace.leave(code)
    return code


def _handle(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    try:
        _start(args, env)
        return args.handler(args, env)
    except Stopped as err:
        # Not a failure: the work is saved and the scheduler is expected to start us again.
        logs.say(f"trainbox: {err.line()}")
        return err.exit_code
    except TrainboxError as err:
        logs.say(f"trainbox: error: {err.line()}")
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

    run_parser = commands.add_parser(
        "run",
        help="train (the image's default command)",
        epilog=CONFIG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_flag(run_parser)
    _debug_flag(run_parser)
    run_parser.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="config overrides"
    )
    run_parser.set_defaults(handler=run.main)

    eval_parser = commands.add_parser(
        "eval", help="a checkpoint's validation metrics, sharded exactly over every rank"
    )
    _checkpoint_flags(eval_parser)
    eval_parser.add_argument("--output", metavar="FILE", help="also write the result as JSON here")
    eval_parser.add_argument("--force", action="store_true", help="replace an existing --output")
    _debug_flag(eval_parser)
    eval_parser.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="config overrides"
    )
    eval_parser.set_defaults(handler=eval.main)

    predict_parser = commands.add_parser(
        "predict", help="one prediction per input, in input order, into one CSV or JSONL file"
    )
    _checkpoint_flags(predict_parser)
    predict_parser.add_argument(
        "--output", metavar="FILE", required=True, help="predictions.csv or predictions.jsonl"
    )
    predict_parser.add_argument(
        "--split", choices=("val", "train"), default="val", help="default: val"
    )
    predict_parser.add_argument("--force", action="store_true", help="replace an existing --output")
    predict_parser.add_argument(
        "--chunk-size",
        type=_positive,
        default=1024,
        metavar="N",
        help="inputs per part file, the unit a rerun can skip (default: 1024)",
    )
    _debug_flag(predict_parser)
    predict_parser.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="config overrides"
    )
    predict_parser.set_defaults(handler=predict.main)

    export_parser = commands.add_parser(
        "export", help="a sharded checkpoint's model as one state-dict file, in one process"
    )
    export_parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        required=True,
        help="a sharded .dcp folder, RUN_DIR/checkpoints/latest, or a run directory (its latest)",
    )
    export_parser.add_argument(
        "--output",
        metavar="FILE",
        required=True,
        help="the state dict's file (torch.save), e.g. model.pt",
    )
    export_parser.add_argument("--force", action="store_true", help="replace an existing --output")
    export_parser.set_defaults(handler=export.main)

    doctor_parser = commands.add_parser(
        "doctor", help="print the launch context, preflight and CPU plan"
    )
    doctor_parser.add_argument("--json", action="store_true", help="print one JSON object")
    doctor_parser.add_argument(
        "--network",
        action="store_true",
        help="measure the job's network: an all-reduce sweep and every node's ring links; exit 3"
        " naming a slow node or link (docs/network-check.md)",
    )
    doctor_parser.add_argument(
        "--network-max-bytes",
        type=_byte_size,
        metavar="BYTES",
        help="largest all-reduce of the sweep, e.g. 64M (default: 256M; at least 1K)",
    )
    doctor_parser.add_argument(
        "--network-min-fraction",
        type=_fraction,
        metavar="F",
        help="a link below F times the reference link is slow (default: 0.5)",
    )
    doctor_parser.add_argument(
        "--network-rated-gbps",
        type=_rate,
        metavar="GBPS",
        help="rated speed of each node's NIC in Gbit/s, instead of what sysfs says of the NICs"
        " NCCL uses; the reference link below F times it fails, even on one node",
    )
    _config_flag(doctor_parser)
    doctor_parser.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="config overrides"
    )
    doctor_parser.set_defaults(handler=doctor.main)

    config_parser = commands.add_parser(
        "config",
        help="print the resolved config, each value marked default, file or override; runs nothing",
        epilog=CONFIG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_flag(config_parser)
    config_parser.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="config overrides"
    )
    config_parser.set_defaults(handler=config.main)

    exec_parser = commands.add_parser(
        "exec",
        help="exec CMD with torchrun-style variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*)",
        usage="trainbox exec [--config FILE] [--debug] [key.sub=value ...] -- CMD [ARGS ...]",
    )
    _config_flag(exec_parser, "YAML config file (preflight, pinning)")
    _debug_flag(exec_parser)
    exec_parser.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="key.sub=value ... -- CMD",
        help="config overrides, as for run, then the command to run after --",
    )
    exec_parser.set_defaults(handler=exec.main)

    report_parser = commands.add_parser(
        "report", help="draw runs' loss and metric curves to one PNG"
    )
    report_parser.add_argument(
        "run_dir", metavar="RUN_DIR", nargs="+", help="one run, or several to compare"
    )
    report_parser.add_argument(
        "--output",
        metavar="FILE",
        help="PNG path (default: RUN_DIR/report.png; ./report.png for several runs)",
    )
    report_parser.set_defaults(handler=report.main)

    hang_parser = commands.add_parser(
        "hang", help="say which rank a hung job waited on, and where each rank's code was"
    )
    hang_parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="the run_dir of a job that ended with exit 4"
    )
    hang_parser.set_defaults(handler=hang.main)
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
        help="a checkpoint file or sharded .dcp folder, RUN_DIR/checkpoints/latest, or a run"
        " directory (its latest)",
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


# Binary multiples, as sizes of buffers are usually meant.
UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def _byte_size(text: str) -> int:
    """A byte count of at least 1 KiB: a number with an optional K, M or G (binary) suffix."""
    number, unit = text.strip(), ""
    if number[-1:].upper() in UNITS and number[-1:].isalpha():
        number, unit = number[:-1], number[-1].upper()
    try:
        value = int(number) * UNITS[unit]
    except ValueError:
        value = 0
    if value < 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size of at least 1K (e.g. 64M)")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive speed in Gbit/s")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]")
    return value
