"""`trainbox config`: the resolved config as YAML, each value marked default, file or override.

No torch here: it answers as fast as `doctor`, and its output is a file `--config` accepts.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import yaml

from trainbox import config
from trainbox.commands import flags
from trainbox.commands.command import Command
from trainbox.config import Resolved, as_dict

HEADER = "# resolved config; after each value, where it came from: default < file < override"


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print every key with its resolved value and source; runs nothing."""
    del env
    print(render(config.resolve(args.config, args.overrides)), end="")
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    flags.config_flag(parser)


COMMAND = Command(
    name="config", arguments=_arguments, handler=main, overrides=True, epilog=flags.CONFIG_EPILOG,
    help="print the resolved config, each value marked default, file or override; runs nothing",
)  # fmt: skip


def render(resolved: Resolved) -> str:
    """Every key of the config in field order; a value's line ends with `# <source>`."""
    return "\n".join([HEADER, *_lines(as_dict(resolved.config), "", 0, resolved)]) + "\n"


def _lines(data: Mapping[str, Any], prefix: str, depth: int, resolved: Resolved) -> list[str]:
    lines: list[str] = []
    pad = "  " * depth
    for name, value in data.items():
        key, label = f"{prefix}{name}", _flow(name)
        if isinstance(value, dict) and value:
            # A section or a mapping with entries: its entries carry the sources.
            lines.append(f"{pad}{label}:")
            lines.extend(_lines(value, f"{key}.", depth + 1, resolved))
        else:
            lines.append(f"{pad}{label}: {_flow(value)}  # {resolved.source(key)}")
    return lines


def _flow(value: Any) -> str:
    """`value` as one line of YAML (quoted where YAML would misread it)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()
