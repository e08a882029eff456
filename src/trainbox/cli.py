"""The `trainbox` command line; the only place that turns errors into exit codes."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Mapping, Sequence

from trainbox import logs
from trainbox.commands.registry import COMMANDS
from trainbox.errors import Stopped, TrainboxError, UsageError
from trainbox.process import exit_grace, preempt, supervise
from trainbox.process.debug import debug_env
from trainbox.version import __version__


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
        and args.command in {command.name for command in COMMANDS if command.overrides}
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


def _parser() -> argparse.ArgumentParser:
    """One subparser per registered command, in the registry's order."""
    parser = argparse.ArgumentParser(
        prog="trainbox",
        description="Detect the launcher, check the node, run PyTorch DDP the same way everywhere.",
    )
    parser.add_argument("--version", action="version", version=f"trainbox {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        subparser = commands.add_parser(
            command.name,
            help=command.help,
            usage=command.usage,
            epilog=command.epilog,
            # An epilog keeps the lines it was written with.
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.arguments(subparser)
        if command.overrides:
            subparser.add_argument(
                "overrides", nargs="*", metavar="key.sub=value", help="config overrides"
            )
        subparser.set_defaults(handler=command.handler)
    return parser
