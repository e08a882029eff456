"""The GPU proof's pure parts: nvidia-smi's report read and held against doctor's, the models,
where the hsdp stage runs.

The reports are the ones recorded on an H200 (acceptance/gpu/results/): CI has no GPU, so
the comparison is tested on what a real driver wrote. The whole script runs on the CPU in
tests/dist/test_gpu_proof_dry_run.py.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "acceptance" / "gpu"))

import gpu_proof
import gputask
import nvidia_smi

RECORDED = Path(__file__).resolve().parents[2] / "acceptance" / "gpu" / "results"
H200_UUID = "GPU-8931d79d-d3f3-c145-7e9f-fe5f69aee1e9"
H200_BUS = "0000:00:06.0"


@pytest.fixture
def smi() -> nvidia_smi.SmiReport:
    return nvidia_smi.parse((RECORDED / "nvidia-smi-q.xml").read_text())


@pytest.fixture
def doctor() -> dict[str, Any]:
    return json.loads((RECORDED / "doctor.json").read_text())


def test_the_recorded_report_reads_as_the_driver_wrote_it(smi: nvidia_smi.SmiReport) -> None:
    assert (smi.driver_version, smi.cuda_version) == ("580.159.04", "13.0")
    (gpu,) = smi.gpus
    assert (gpu.uuid, gpu.pci_bus_id, gpu.name) == (H200_UUID, H200_BUS, "NVIDIA H200")
    assert (gpu.ecc_enabled, gpu.ecc_uncorrected_volatile) == (True, 0)
    assert (gpu.remapped_uncorrectable, gpu.remap_pending, gpu.remap_failed) == (0, False, False)


def test_doctor_on_that_gpu_agrees_with_every_fact(
    doctor: dict[str, Any], smi: nvidia_smi.SmiReport
) -> None:
    rows = nvidia_smi.compare(doctor, smi, {H200_BUS: "0-15"})
    assert nvidia_smi.disagreements(rows) == []
    compared = {row["what"] for row in rows if row["agree"]}
    assert {"driver version", "CUDA version", "UUID", "ecc_uncorrected_volatile",
            "remap_pending", "CPU affinity (sysfs local_cpulist)", "verdict ecc",
            "verdict row_remap"} <= compared  # fmt: skip


def test_a_count_doctor_misread_is_a_disagreement(
    doctor: dict[str, Any], smi: nvidia_smi.SmiReport
) -> None:
    wrong = copy.deepcopy(doctor)
    wrong["gpus"][0]["ecc_uncorrected_volatile"] = 2
    found = nvidia_smi.disagreements(nvidia_smi.compare(wrong, smi, {}))
    assert [row["what"] for row in found] == ["ecc_uncorrected_volatile"]


def test_a_remap_doctor_missed_is_a_verdict_disagreement(doctor: dict[str, Any]) -> None:
    xml = (RECORDED / "nvidia-smi-q.xml").read_text()
    pending = xml.replace("<remapped_row_pending>No<", "<remapped_row_pending>Yes<")
    found = nvidia_smi.disagreements(nvidia_smi.compare(doctor, nvidia_smi.parse(pending), {}))
    assert {row["what"] for row in found} == {"remap_pending", "verdict row_remap"}


def test_a_gpu_doctor_does_not_see_is_a_disagreement(
    doctor: dict[str, Any], smi: nvidia_smi.SmiReport
) -> None:
    missing = copy.deepcopy(doctor)
    missing["gpus"][0]["uuid"] = "GPU-00000000-0000-0000-0000-000000000000"
    found = nvidia_smi.disagreements(nvidia_smi.compare(missing, smi, {}))
    assert [row["what"] for row in found] == ["UUID"]


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:AB:00.0", "0000:ab:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
    ],
)
def test_bus_ids_read_as_sysfs_writes_them(nvml: str, sysfs: str) -> None:
    assert nvidia_smi.sysfs_bus_id(nvml) == sysfs


@pytest.mark.parametrize(
    ("factory", "millions"), [(gputask.resnet50, 25.557032), (gputask.gpt2, 124.439808)]
)
def test_the_throughput_models_have_their_published_sizes(factory: Any, millions: float) -> None:
    """ResNet-50 as torchvision builds it; GPT-2 small with its head tied to the embedding."""
    params = sum(p.numel() for p in factory().parameters())
    assert params / 1e6 == pytest.approx(millions, abs=1e-6)


@pytest.mark.parametrize(
    ("dry", "gpus", "args", "device", "said"),
    [
        (True, 0, ("--quick",), "cpu", "CPU dry run"),
        (False, 8, ("--device=cuda",), "cuda", "NCCL, one GPU a rank (4 of 8)"),
        (False, 4, ("--device=cuda",), "cuda", "NCCL"),
        # Fewer than a GPU a rank: gloo on the CPUs, and the check's detail says so and why.
        (False, 1, (), "cpu", "gloo on the CPUs, not NCCL: 1 GPU(s)"),
        (False, 3, (), "cpu", "takes 4 under NCCL"),
    ],
)
def test_the_hsdp_stage_runs_on_nccl_only_with_a_gpu_a_rank(
    dry: bool, gpus: int, args: tuple[str, ...], device: str, said: str
) -> None:
    place = gpu_proof.hsdp_placement(dry=dry, gpus=gpus)
    assert (place.args, place.device) == (args, device)
    assert said in place.why
