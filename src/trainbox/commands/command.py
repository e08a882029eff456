"""What a command module declares once: its name, help, flags, handler, and whether it takes
`key.sub=value` overrides; the CLI builds its parser from these alone."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Runs a command: the parsed command line and the environment in, the exit code out.
Handler = Callable[[argparse.Namespace, Mapping[str, str]], int]


@dataclass(frozen=True, kw_only=True, slots=True)
class Command:
    """One `trainbox` command, as its own module declares it."""

    # What the user types after `trainbox`.
    name: str
    # Its line in `trainbox --help`.
    help: str
    # Adds its own flags and positionals to its subparser (the overrides are the CLI's to add).
    arguments: Callable[[argparse.ArgumentParser], None]
    # What runs it.
    handler: Handler
    # Takes `key.sub=value` config overrides, before or after its flags.
    overrides: bool
    # Text after the flags in `trainbox NAME --help`, kept as written; None: none.
    epilog: str | None = None
    # Its usage line, where argparse's own would hide how the words go; None: argparse's.
    usage: str | None = None
