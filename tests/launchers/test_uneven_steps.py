"""Steps whose nodes run different numbers of ranks train like even ones (issue 13, defect 2).

`salloc -N2 -n3 --exclusive srun --whole` puts two tasks on n1 and one on n2, and gives the step
both nodes whole: the two share n1's CPUs, the lone task has n2's to itself, so their CPU
budgets differ. The peer check must not call that a mismatch. (A plain `srun -N2 -n3` would
allocate the lone task one CPU, and trainbox keeps a task to what Slurm allocated it.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launchers.slurm_cluster import SlurmCluster
from runs import clean_env, summary

pytestmark = pytest.mark.slow

# Few steps: the point is getting past the peer check and finishing together.
SHORT = ["train.max_steps=6", "train.log_every=2", "train.eval_every=6", "train.ckpt_every=6"]
TIMEOUT_S = 180
# The cluster's env is the caller's minus Slurm's; threads as in the other launcher tests.
SLURM_ENV = {"OMP_NUM_THREADS": clean_env()["OMP_NUM_THREADS"]}


def _slurm_train(cluster: SlurmCluster, run_dir: Path, *launch: str) -> str:
    argv = [*launch, "python", "-m", "trainbox", "run", f"run_dir={run_dir}", *SHORT]
    proc = cluster.run(argv, env=SLURM_ENV, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{argv} exited {proc.returncode}\n{proc.stderr[-6000:]}\n{cluster.diagnostics()}"
    )
    return proc.stderr


def _column(log: str, name: str) -> list[str]:
    """Column `name` of the cluster table rank 0 logs, one value per rank."""
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    (table,) = [event["table"] for event in events if event.get("event") == "cluster"]
    header, *rows = table.strip().splitlines()
    index = header.split().index(name)
    return [row.split()[index] for row in rows]


def test_srun_N2_n3_trains_although_the_ranks_budgets_differ(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    whole = ["salloc", "-N2", "-n3", "--exclusive", "srun", "--whole"]
    log = _slurm_train(slurm_cluster, tmp_path / "run", *whole)
    got = summary(tmp_path / "run")
    assert (got["steps"], got["world_size"]) == (6, 3)
    # The case under test: n1's two tasks share its CPUs, n2's one task has them all.
    assert sorted(_column(log, "cpu_budget")) == ["1", "1", "2"], log[-4000:]
