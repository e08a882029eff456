"""scripts/pick-python: which interpreter scripts/venv.sh makes .venv from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "pick-python"


def fake_python(folder: Path, name: str, *, usable: bool) -> Path:
    """An executable that answers pick-python's check as a usable Python would, or not."""
    path = folder / name
    path.write_text(f"#!/bin/sh\nexit {0 if usable else 1}\n")
    path.chmod(0o755)
    return path


def pick(*candidates: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if key != "TRAINBOX_PYTHON"}
    return subprocess.run([str(SCRIPT), *candidates], env=clean | (env or {}),
                          capture_output=True, text=True, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("candidates", "chosen"),
    [
        (("good", "other"), "good"),
        (("old", "good"), "good"),
        (("missing", "good"), "good"),
    ],
)
def test_the_first_usable_candidate_is_chosen(
    tmp_path: Path, candidates: tuple[str, ...], chosen: str
) -> None:
    fake_python(tmp_path, "good", usable=True)
    fake_python(tmp_path, "other", usable=True)
    fake_python(tmp_path, "old", usable=False)
    proc = pick(*(str(tmp_path / name) for name in candidates))
    assert (proc.returncode, proc.stdout) == (0, f"{tmp_path / chosen}\n"), proc.stderr


def test_a_command_name_is_found_on_path(tmp_path: Path) -> None:
    fake_python(tmp_path, "python3", usable=True)
    proc = pick("python3", env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.stdout == f"{tmp_path / 'python3'}\n", proc.stderr


def test_trainbox_python_wins_over_every_candidate(tmp_path: Path) -> None:
    good = fake_python(tmp_path, "good", usable=True)
    proc = pick(str(good), env={"TRAINBOX_PYTHON": "/opt/py/bin/python3.12"})
    assert proc.stdout == "/opt/py/bin/python3.12\n"


def test_none_usable_is_one_line_with_a_hint(tmp_path: Path) -> None:
    old = fake_python(tmp_path, "old", usable=False)
    proc = pick(str(old), str(tmp_path / "missing"))
    assert proc.returncode == 1
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert str(old) in line
    assert "HINT:" in line


def test_the_python_running_the_tests_passes_the_real_check() -> None:
    # The suite runs in a venv that scripts/venv.sh made, so its interpreter is one pick-python
    # accepts: this catches a check that no real Python would pass.
    proc = pick(sys.executable)
    assert proc.stdout == f"{sys.executable}\n", proc.stderr
