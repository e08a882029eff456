"""Straggler detection across Slurm nodes: `srun -N2 --ntasks-per-node=2` on the local two-node
cluster, rank 2 (the first task on n2) slowed by TRAINBOX_FAULT=slow, is named with its host
within 3 log windows of the slowdown."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from launchers.slurm_cluster import SlurmCluster
from runs import clean_env

pytestmark = pytest.mark.slow

LOG_EVERY = 20
SLOW_RANK, FROM = 2, 51
TIMEOUT_S = 180
# The cluster's env is the caller's minus Slurm's; threads as in the other launcher tests.
SLURM_ENV = {"OMP_NUM_THREADS": clean_env()["OMP_NUM_THREADS"]}


def test_srun_names_the_slow_rank_on_the_second_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    steps = FROM - 1 + 4 * LOG_EVERY
    argv = ["srun", "-N2", "--ntasks-per-node=2", "python", "-m", "trainbox", "run",
            f"run_dir={run_dir}", "model.args.hidden=16", "model.args.layers=1",
            "train.batch_size=16", "train.eval_every=0", "train.ckpt_every=0",
            f"train.max_steps={steps}", f"train.log_every={LOG_EVERY}"]  # fmt: skip
    fault = {"TRAINBOX_FAULT": f"slow:rank={SLOW_RANK}:ms=20:from={FROM}"}
    proc = slurm_cluster.run(argv, env=SLURM_ENV | fault, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{argv} exited {proc.returncode}\n{proc.stderr[-6000:]}\n{slurm_cluster.diagnostics()}"
    )
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (named,) = [record for record in lines if record["kind"] == "straggler"]
    assert (named["rank"], named["host"], named["cause"]) == (SLOW_RANK, platform.node(), "compute")
    delay = (named["step"] - (FROM - 1)) / LOG_EVERY
    assert delay <= 3, f"named at step {named['step']}, {delay} windows after the slowdown"
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    (warned,) = [event for event in events if event.get("event") == "straggler"]
    # Slurm places tasks 2 and 3 on the second node: the warning comes from there.
    assert (warned["rank"], warned["local_rank"]) == (SLOW_RANK, 0)
