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


TRAINING_SBATCH = ("train-per-gpu.sbatch", "train-per-node.sbatch", "train-mpirun.sbatch")


@pytest.mark.parametrize("script", TRAINING_SBATCH)
def test_sbatch_header_gives_the_command_and_preemption_settings(script: str) -> None:
    text = (ROOT / "slurm" / script).read_text()
    assert f"sbatch slurm/{script}" in text
    for directive in (
        "--requeue",
        "--signal=B:USR1@",
        "--open-mode=append",
        "--gpus-per-node=",
        "--cpus-per-task=",
    ):
        assert f"#SBATCH {directive}" in text
    assert "--kill-on-bad-exit=1" in text or "SLURM_KILL_BAD_EXIT=1" in text
    assert "trainbox_step" in text
