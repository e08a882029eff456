"""The suite's own plumbing under pytest-xdist: CI's every-tier check still fails a run.

Each test runs pytest again in a subprocess, on a few files and with every test deselected or
only collected, so nothing heavy runs twice.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiers

ROOT = Path(__file__).parents[2]


def inner_pytest(
    tmp_path: Path, *args: str, require_all: bool = False
) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("xdist") is None:
        tiers.unavailable("pytest-xdist is not installed (pip install -e '.[test]')")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.pop("TRAINBOX_REQUIRE_ALL", None)
    if require_all:
        env["TRAINBOX_REQUIRE_ALL"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--basetemp",
            str(tmp_path / "basetemp"), *args]  # fmt: skip
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    "workers", [[], ["-n", "1", "--dist", "loadgroup"]], ids=["serial", "xdist"]
)
def test_a_tier_that_collects_nothing_fails_a_run_that_requires_all(
    tmp_path: Path, workers: list[str]
) -> None:
    # The whole suite is selected (no paths), but three tiers are left out and every test of
    # the other two deselected: the check must fail the run before anything runs.
    ignored = [f"--ignore=tests/{tier}" for tier in ("unit", "dist", "launchers", "container")]
    proc = inner_pytest(tmp_path, *workers, *ignored, "-k", "no_test_has_this_name",
                        require_all=True)  # fmt: skip
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-3000:] + proc.stderr
    assert "no tests collected from tests/unit, tests/dist" in proc.stdout + proc.stderr
