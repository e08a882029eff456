"""A GPU going bad during a real `trainbox run` in node mode (torchrun, 2 ranks, gloo on the CPU):
a rising ECC count or a fatal XID stops every rank after one agreed step with a checkpoint and
exit 3 naming the GPU and its host; thermal throttling is reported; an application XID is not
a fault.

NVML is simulated at the narrowest boundary there is, the pynvml module (tests/fakenvml_shim on
PYTHONPATH, the node named by TRAINBOX_FAKE_NVML): everything from NVML's answers on is the real
code, the sampler thread, the grading, the stop request, the vote, the checkpoint, the exit code
and the supervisor's. A higher seam (a fake sampler) would skip the NVML calls and their error
codes, and there is no lower one without a GPU. The ranks train on the CPU while NVML lists 8
H100s: telemetry follows NVML's list (local rank i watches visible GPU i), never the training
device, so rank 1 watches the scripted GPU 1. Changes are scripted by sample count, not time.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from fakenvml import UUIDS
from runs import summary, train

pytestmark = pytest.mark.slow

SHIM = Path(__file__).parents[1] / "fakenvml_shim"
# Node mode, so the supervisor's exit code is the workers' (torchrun's own would be 1); wide
# enough that a step takes milliseconds; samples every 50 ms.
CONFIG = ["dist.procs_per_node=2", "model.args.hidden=512", "health.sample_every_s=0.05",
          "train.log_every=5", "train.eval_every=0", "train.ckpt_every=0"]  # fmt: skip
HOST = platform.node()


def run(run_dir: Path, scenario: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, "TRAINBOX_FAKE_NVML": scenario}
    return train(run_dir, *CONFIG, *args, env=env, check=False)


def logged(stderr: str, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of `event` the workers wrote."""
    lines = (json.loads(line) for line in stderr.splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == event]


def last_record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.parametrize(
    ("scenario", "what"),
    [
        ("ecc_rises_in_training", "volatile uncorrected ECC errors rose from 0 to 1"),
        ("xid79_in_training", "XID 79 (GPU has fallen off the bus)"),
    ],
)
def test_a_gpu_fault_checkpoints_every_rank_and_exits_3_naming_gpu_and_host(
    tmp_path: Path, scenario: str, what: str
) -> None:
    # Without the fault the run would go on for 100,000 steps.
    proc = run(tmp_path, scenario, "train.max_steps=100000")
    assert proc.returncode == 3, proc.stderr[-3000:]
    record = last_record(tmp_path)
    assert (record["kind"], record["reason"]) == ("stop", "GPU fault")
    stop = record["step"]
    saved = torch.load(
        tmp_path / "checkpoints" / f"step-{stop:08d}.pt", map_location="cpu", weights_only=True
    )
    assert saved["step"] == stop
    assert not (tmp_path / "summary.json").exists()
    errors = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error:")]
    stopped = f"trainbox: error: stopped after step {stop} (GPU fault)"
    assert len(errors) == 2
    assert all(line.startswith(stopped) and "HINT: " in line for line in errors)
    # Rank 1 saw it and names the GPU; rank 0 points at rank 1's line.
    assert sum(f"GPU 1 ({UUIDS[1]}) on host {HOST}, rank 1: {what}" in e for e in errors) == 1


@pytest.fixture(scope="module")
def hot(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A run whose GPU 1 reports XID 13 at its first sample and throttles from its second."""
    run_dir = tmp_path_factory.mktemp("hot")
    return run_dir, run(run_dir, "throttles_and_xid13_in_training", "train.max_steps=60")


def test_thermal_throttling_is_reported_with_its_reason(
    hot: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    run_dir, proc = hot
    assert proc.returncode == 0, proc.stderr[-3000:]
    (warning,) = logged(proc.stderr, "gpu_throttled")
    assert warning["reasons"] == ["hw_thermal_slowdown"]
    assert warning["gpu"] == f"GPU 1 ({UUIDS[1]}) on host {HOST}, rank 1"
    assert summary(run_dir)["steps"] == 60
    # The log points' gpu records: both ranks sampled; rank 1's GPU throttles, rank 0's not.
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    gpu = [r for r in map(json.loads, lines) if r["kind"] == "gpu"]
    assert [r["step"] for r in gpu] == list(range(5, 61, 5))
    assert all(r["ranks"] == 2 and r["util_p50"] == 97 for r in gpu)
    hot = gpu[-1]
    assert hot["throttle_hw_thermal_slowdown"] == 1
    assert (hot["temp_c_min"], hot["temp_c_max"]) == (61, 89)
    assert (hot["sm_clock_mhz_min"], hot["sm_clock_mhz_max"]) == (1410, 1980)
    host = [r for r in map(json.loads, lines) if r["kind"] == "host"]
    assert len(host) == len(gpu)
    assert all(r["ranks"] == 2 and r["rss_mib_min"] > 0 for r in host)


def test_an_application_xid_is_logged_and_training_goes_on(
    hot: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    run_dir, proc = hot
    (ignored,) = logged(proc.stderr, "gpu_event_ignored")
    assert ignored["what"] == "XID 13 (an application fault)"
    assert logged(proc.stderr, "gpu_fault") == []
    assert summary(run_dir)["steps"] == 60
