"""Shared test plumbing: the tier switch lives in tests/tiers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# tests import helpers such as `tiers` and `launchers.slurm_cluster` by plain name.
sys.path.insert(0, str(Path(__file__).parent))


# Every tier must be collected in CI: a directory pytest quietly ignores would pass as green.
TIERS = ("unit", "dist", "launchers", "manifests", "container")


def pytest_collection_finish(session: pytest.Session) -> None:
    """With TRAINBOX_REQUIRE_ALL=1 and the whole suite selected, fail if a tier collects nothing."""
    import tiers

    if not tiers.REQUIRE_ALL or session.config.args not in ([], ["tests"]):
        return
    tests_dir = Path(__file__).parent
    seen = {Path(item.path).relative_to(tests_dir).parts[0] for item in session.items}
    missing = [tier for tier in TIERS if tier not in seen]
    if missing:
        raise pytest.UsageError(f"no tests collected from tests/{', tests/'.join(missing)}")
