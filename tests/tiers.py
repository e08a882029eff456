"""Skip a slow tier when its tools are missing, except in CI where every tier must run."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

# CI sets this so that a missing tool fails the run instead of silently skipping a tier.
REQUIRE_ALL = os.environ.get("TRAINBOX_REQUIRE_ALL") == "1"


def unavailable(reason: str) -> NoReturn:
    """Skip with `reason`, or fail with it when TRAINBOX_REQUIRE_ALL=1."""
    if REQUIRE_ALL:
        pytest.fail(f"TRAINBOX_REQUIRE_ALL=1 but this tier cannot run: {reason}")
    pytest.skip(reason)


def require_commands(*names: str) -> None:
    """Make sure each command is on PATH, else skip (or fail in CI) naming the missing ones."""
    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        unavailable(f"missing commands: {', '.join(missing)} (see .ci/install-system)")
