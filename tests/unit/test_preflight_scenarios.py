"""`trainbox doctor` on simulated nodes: each fake-NVML scenario gives its documented verdict.

A child process imports tests/fakenvml_shim/pynvml.py in place of pynvml (no GPU in CI), so the
whole path runs for real: survey, detection, judgement, pinning, JSON output and exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.preflight import node

SHIM = Path(__file__).parents[1] / "fakenvml_shim"
# The fake has no driver; whether that is news depends on this machine's real PCI bus: on one
# without an NVIDIA device it is CPU mode, said in the report but not warned about.
NO_DRIVER_WARNS = {"driver"} if node.nvidia_devices() else set()

# scenario, extra config, checks that fail, checks that warn (beyond the CPU-build torch warning), exit code
SCENARIOS = [
    ("healthy_node", [], set(), set(), 0),
    ("ecc_uncorrectable", [], {"ecc"}, set(), 3),
    ("row_remap_failure", [], {"row_remap"}, set(), 3),
    ("mig_instances", [], {"mig"}, set(), 3),
    ("pcie_x4", [], set(), {"pcie_link"}, 0),
    ("busy_gpu", [], {"gpu_processes"}, {"memory"}, 3),
    ("lost_gpu", [], {"gpu_lost"}, set(), 3),
    ("recovery_reset", [], {"recovery_action"}, set(), 3),
    ("thermal_throttle", [], set(), {"clocks", "temperature"}, 0),
    ("all_optional_unsupported", [], set(), set(), 0),
    ("no_driver", [], set(), NO_DRIVER_WARNS, 0),
    ("no_driver", ["preflight.gpus=require"], {"driver"}, set(), 3),
    ("ecc_uncorrectable", ["preflight.fatal=[row_remap]"], set(), {"ecc"}, 0),
]


def doctor(scenario: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SLURM_", "OMPI_", "PMI"))
    }
    env |= {"PYTHONPATH": str(SHIM), "TRAINBOX_FAKE_NVML": scenario}
    argv = [sys.executable, "-m", "trainbox", "doctor", "--json", *overrides]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("scenario", "overrides", "fails", "warns", "code"), SCENARIOS)
def test_scenario_verdict(
    scenario: str, overrides: list[str], fails: set[str], warns: set[str], code: int
) -> None:
    proc = doctor(scenario, *overrides)
    assert proc.returncode == code, proc.stderr[-2000:]
    checks = json.loads(proc.stdout)["checks"]
    by_status = {
        status: {c["name"] for c in checks if c["status"] == status} for status in ("fail", "warn")
    }
    assert by_status["fail"] == fails
    assert by_status["warn"] - {"cuda_version"} == warns


def test_a_fatal_finding_names_the_gpu_by_index_and_uuid() -> None:
    (check,) = [
        c for c in json.loads(doctor("lost_gpu").stdout)["checks"] if c["name"] == "gpu_lost"
    ]
    assert check["message"].startswith("GPU 6 (")
    assert "lost" in check["message"]
    assert check["hint"]


def test_unsupported_readings_are_skipped_not_crashed() -> None:
    checks = json.loads(doctor("all_optional_unsupported").stdout)["checks"]
    skipped = {c["name"] for c in checks if c["status"] == "skip"}
    assert {
        "ecc",
        "recovery_action",
        "row_remap",
        "clocks",
        "temperature",
        "pcie_link",
        "mig",
    } <= skipped


def test_run_stops_with_exit_3_and_one_line_listing_every_fatal_check(tmp_path: Path) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SLURM_", "OMPI_", "PMI"))
    }
    env |= {"PYTHONPATH": str(SHIM), "TRAINBOX_FAKE_NVML": "busy_gpu", "CUDA_VISIBLE_DEVICES": "1"}
    argv = [sys.executable, "-m", "trainbox", "run", f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error:")]
    assert "gpu_processes: GPU 1 (GPU-5a7e3c1b" in line
    assert "HINT: " in line
    # Nothing of a run is written: only the record that names this node as bad, which a
    # scheduler's next attempt reads to leave the node out (docs/reliability.md).
    run = tmp_path / "run"
    (record,) = [path for path in run.rglob("*") if path.is_file()]
    assert record.relative_to(run).parts[0] == "bad_nodes"
    assert record.name == "rank-0.json"
    assert json.loads(record.read_text())["reason"] == "preflight"


def test_every_check_judge_emits_is_a_configurable_name() -> None:
    # config.CHECK_NAMES decides what preflight.fatal accepts and FATAL_CHECKS what stops a run:
    # a check renamed in preflight/checks.py alone would quietly turn from fatal to warning.
    from trainbox.config import CHECK_NAMES, FATAL_CHECKS

    emitted = {
        check["name"]
        for scenario in ("healthy_node", "no_driver")
        for check in json.loads(doctor(scenario).stdout)["checks"]
    }
    assert emitted == set(CHECK_NAMES)
    assert set(FATAL_CHECKS) <= emitted


def test_doctor_reports_what_nvidia_smi_shows_per_gpu() -> None:
    """Each GPU's health facts and the driver's versions, so they can be held against nvidia-smi."""
    report = json.loads(doctor("healthy_node").stdout)
    assert report["driver"] == {"version": "570.124.06", "cuda": "12.8"}
    first = report["gpus"][0]
    assert first["uuid"] == "GPU-2f4c1a9e-6b7d-4e21-9c3a-5d8e7f601a10"
    assert first["pci_bus_id"] == "0000:18:00.0"
    assert first["ecc_uncorrected_volatile"] == 0
    assert (first["remapped_uncorrectable"], first["remap_pending"], first["remap_failed"]) == (
        0,
        False,
        False,
    )
    assert (first["numa_node"], first["cpu_affinity"]) == (0, "0-47")
    assert report["gpus"][4]["cpu_affinity"] == "48-95"


def test_doctor_reports_a_remapping_failure_on_its_gpu() -> None:
    gpus = json.loads(doctor("row_remap_failure").stdout)["gpus"]
    assert [gpu["remap_failed"] for gpu in gpus].count(True) == 1
