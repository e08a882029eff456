"""`trainbox config`: the resolved config, each value marked default, file or override."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from trainbox import config, config_view


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print every key with its resolved value and source; runs nothing."""
    del env
    print(config_view.render(config.resolve(args.config, args.overrides)), end="")
    return 0
