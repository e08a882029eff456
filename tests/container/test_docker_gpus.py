"""`docker run --gpus all` with the CPU image on a machine with no GPU, as far as this machine
goes: podman 4.3.1 runs it, which accepts `--gpus` for Docker's sake and does nothing with it,
so the container sees what Docker's would without a GPU: no /dev/nvidia*, no driver library.
(Docker itself refuses `--gpus` where the NVIDIA container toolkit is missing, before the
container starts; that is not tried here: Docker is not installed.)"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from container.image import podman

pytestmark = pytest.mark.slow

QUICK = ["run_dir=/tmp/run", "train.max_steps=10", "train.eval_every=10"]


def docker_run_gpus_all(image: str, *args: str) -> subprocess.CompletedProcess[str]:
    return podman("run", "--rm", "--gpus", "all", image, *args, check=False)


def events(stderr: str, name: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [event for event in found if event["event"] == name]


def test_no_gpu_trains_on_the_cpu_and_says_cpu_mode_without_a_warning(built_image: str) -> None:
    # This machine shows no NVIDIA device at all (no PCI function, no /dev/nvidia*): a missing
    # driver is no news there, so the run logs no warning and doctor says CPU mode as a skip.
    proc = docker_run_gpus_all(built_image, *QUICK)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [e for e in events(proc.stderr, "preflight") if e["name"] == "driver"] == []
    assert [e["device"] for e in events(proc.stderr, "training")] == ["cpu"]
    assert "trained 10 steps: " in proc.stdout
    doctor = docker_run_gpus_all(built_image, "doctor", "--json")
    (driver,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "driver"]
    assert driver["status"] == "skip"
    assert driver["message"].startswith("no NVIDIA driver, CPU mode: no NVIDIA device here")


def test_no_gpu_with_gpus_required_exits_3_with_one_line_and_a_hint(built_image: str) -> None:
    proc = docker_run_gpus_all(built_image, *QUICK, "preflight.gpus=require")
    assert proc.returncode == 3, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("trainbox: error: driver: no usable NVIDIA driver: ")
    assert errors[0].endswith(
        ". HINT: run on a GPU node with the driver loaded (docker --gpus all, apptainer --nv)"
    )
    assert events(proc.stderr, "training") == []
