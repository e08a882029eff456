"""Training from tar shards under srun on the real two-node Slurm cluster: one task per node,
2 DataLoader workers each; rank 1 killed with SIGKILL mid-epoch, and the same srun again ends
with the uninterrupted run's params_sha256, as under torchrun (tests/dist/test_streams.py)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from launchers.slurm_cluster import SlurmCluster
from runs import summary
from stream_shards import write_uneven

pytestmark = pytest.mark.slow

PYTHON = sys.executable
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# Generous for one srun on a loaded 2-core box; a run here takes about 10 s.
TIMEOUT_S = 180
# 136 samples in 6 shards of very different sizes: 17 steps per epoch at 2 ranks x 4.
SIZES = (5, 40, 17, 3, 60, 11)
# After step 10 of epoch 0's 17, past the checkpoint of step 7: a resume mid-epoch.
KILLED_AFTER = 10


def config(shards: Path) -> list[str]:
    return [
        "data.factory=trainbox.tasks.shards:data",
        f"data.args.train={shards}",
        "data.args.shuffle_buffer=8",
        "model.factory=trainbox.tasks.mlp:mlp",
        "model.args.in_features=2",
        "model.args.out_features=3",
        "model.args.hidden=64",
        "train.batch_size=4",
        "train.max_steps=24",
        "train.log_every=4",
        "train.eval_every=0",
        "train.ckpt_every=7",
        "pinning.num_workers=2",
        "dist.timeout_s=30",
    ]


def srun(run_dir: Path, shards: Path) -> list[str]:
    """One task on each of the two nodes, running `python -m trainbox run`; one dead task ends
    the step, as in slurm/*.sbatch."""
    name = f"streams-{uuid.uuid4().hex[:8]}"
    return ["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", f"--job-name={name}",
            PYTHON, "-m", "trainbox", "run", f"run_dir={run_dir}", *config(shards)]  # fmt: skip


def tail(text: str, cluster: SlurmCluster) -> str:
    return f"{text[-6000:]}\n{cluster.diagnostics()}"


def stream_epochs(text: str) -> list[tuple[int, int]]:
    """(epoch, start) of each `stream epoch` event rank 0 logged."""
    found = [json.loads(line) for line in text.splitlines() if line.startswith('{"epoch"')]
    return [(e["epoch"], e["start"]) for e in found if e.get("event") == "stream epoch"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_uneven(tmp_path_factory.mktemp("streams") / "shards", SIZES, seed=0)


def test_a_rank_killed_mid_epoch_under_srun_resumes_to_the_same_parameters(
    slurm_cluster: SlurmCluster, shards: Path, tmp_path: Path
) -> None:
    # The uninterrupted run and the killed one side by side: the cluster has room for both.
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    fault = {"TRAINBOX_FAULT": f"kill:rank=1:step={KILLED_AFTER}",
             "TRAINBOX_FAULT_ONCE": str(tmp_path / "once")}  # fmt: skip
    uninterrupted = slurm_cluster.popen(srun(reference, shards), env=ENV)
    killed = slurm_cluster.popen(srun(run_dir, shards), env=ENV | fault)
    try:
        outputs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in (uninterrupted, killed)]
    finally:
        for proc in (uninterrupted, killed):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert uninterrupted.returncode == 0, tail(outputs[0], slurm_cluster)
    assert killed.returncode != 0, tail(outputs[1], slurm_cluster)
    assert (tmp_path / "once.0").exists(), "the kill never fired"
    assert "task 1: Killed" in outputs[1], tail(outputs[1], slurm_cluster)
    assert not (run_dir / "summary.json").exists()

    again = slurm_cluster.run(srun(run_dir, shards), env=ENV | fault, timeout=TIMEOUT_S)
    assert again.returncode == 0, tail(again.stdout + again.stderr, slurm_cluster)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["resumed_from"] == str(run_dir / "checkpoints" / "step-00000007.pt")
    # Mid-epoch: epoch 0 goes on at its 8th batch, then epoch 1 from its start.
    assert stream_epochs(again.stdout + again.stderr) == [(0, 7), (1, 0)]
    got, want = summary(run_dir), summary(reference)
    assert (got["steps"], got["world_size"]) == (24, 2)
    assert got["params_sha256"] == want["params_sha256"]
