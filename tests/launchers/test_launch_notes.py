"""Launch variables that detection ignores are named by `trainbox doctor` and logged at start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launchers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

DOCTOR = [sys.executable, "-m", "trainbox", "doctor", "--json"]


def _report(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, f"doctor exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report: dict[str, object] = json.loads(proc.stdout)
    return report


def _only_note(report: dict[str, object]) -> str:
    notes = report["notes"]
    assert isinstance(notes, list)
    assert len(notes) == 1, notes
    return str(notes[0])


def _logged_notes(stderr: str) -> list[str]:
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [event["note"] for event in events if event.get("event") == "launch note"]


def test_doctor_names_local_and_node_rank_set_without_rank(clean_env: dict[str, str]) -> None:
    env = clean_env | {"LOCAL_RANK": "1", "NODE_RANK": "1"}
    proc = subprocess.run(DOCTOR, env=env, capture_output=True, text=True, timeout=120)
    report = _report(proc)
    assert (report["launcher"], report["world_size"]) == ("single", 1)
    note = _only_note(report)
    assert note.startswith("ignoring LOCAL_RANK=1, NODE_RANK=1: RANK and WORLD_SIZE are not set")
    assert _logged_notes(proc.stderr) == [note]


def test_doctor_names_stale_rank_and_world_size_inside_an_srun_step(
    slurm_cluster: SlurmCluster,
) -> None:
    # srun hands the caller's environment to the task: an outer job's RANK/WORLD_SIZE with it.
    proc = slurm_cluster.run(["srun", "-N1", "-n1", *DOCTOR], env={"RANK": "5", "WORLD_SIZE": "8"})
    report = _report(proc)
    assert (report["launcher"], report["rank"], report["world_size"]) == ("slurm", 0, 1)
    note = _only_note(report)
    assert note.startswith("ignoring RANK=5, WORLD_SIZE=8 from the environment: srun step ")
    assert note.endswith(" makes this task rank 0 of 1 (SLURM_PROCID, SLURM_STEP_NUM_TASKS)")
    assert _logged_notes(proc.stderr) == [note]
