"""Every shell script we ship or run parses and is shellcheck-clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import tiers

ROOT = Path(__file__).parents[2]
SCRIPTS = sorted(
    [
        *ROOT.glob("entrypoint/*.sh"),
        *ROOT.glob("slurm/*.sbatch"),
        *(path for path in ROOT.glob("scripts/*") if path.is_file() and path.suffix != ".py"),
        *ROOT.glob(".ci/*"),
        ROOT / "docker" / "slim",
    ]
)


def test_the_script_list_is_not_empty() -> None:
    assert len(SCRIPTS) >= 6


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_shellcheck(script: Path) -> None:
    tiers.require_commands("shellcheck")
    proc = subprocess.run(
        ["shellcheck", "-x", str(script)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_parses(script: Path) -> None:
    shell = "sh" if script.read_text().startswith("#!/bin/sh") else "bash"
    subprocess.run([shell, "-n", str(script)], check=True)
