"""In-process recovery (dist.recovery=in_process) on the real two-node Slurm cluster.

`srun -N2 --ntasks-per-node=1` runs trainbox in node mode with two workers per node (world size
4): each worker keeps its rank's trainer and a warm spare. The trainer of rank 3, on the second
node, is SIGKILLed right after an optimizer step. Its spare takes the rank, the survivors on both
nodes re-form the group on torchrun's agent store and hand it their state, and the job goes on
without a restart: exit 0, one recovery recorded, and the parameters of the same job left alone.
"""

from __future__ import annotations

import datetime
import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainbox.train.watch.control import ABORT_WAIT_S

from launchers.slurm_cluster import SlurmCluster
from runs import summary

pytestmark = pytest.mark.slow

PYTHON = sys.executable
# Added to the cluster's client env (the caller's env minus Slurm's, the venv first on PATH).
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# Generous for two node-mode jobs at once on a loaded 2-core box; the pair takes 35-50 s here,
# nearly all of it start-up: each job runs 16 Python processes (per node: trainbox, torchrun's
# agent, and per worker a keeper, its trainer and its spare).
TIMEOUT_S = 240
# A peer's collective gives up after this: a recovery that took as long waited out a timeout.
DIST_TIMEOUT_S = 20
# Slurm puts node rank 1, and with it ranks 2 and 3, on the job's second node.
KILLED_RANK = 3
KILLED_AFTER = 10
CONFIG = [
    "train.max_steps=40",
    "train.log_every=5",
    "train.eval_every=0",
    "train.ckpt_every=0",
    "dist.procs_per_node=2",
    "dist.recovery=in_process",
    f"dist.timeout_s={DIST_TIMEOUT_S}",
]


@dataclass(frozen=True)
class Job:
    """One finished srun of the module's job, and what it printed."""

    run_dir: Path
    returncode: int
    output: str


@dataclass(frozen=True)
class Runs:
    """The job left alone, the same job with rank 3's trainer killed, and the fault's marker."""

    reference: Job
    killed: Job
    once: Path


def srun(run_dir: Path) -> list[str]:
    """One task on each of the two nodes, each its node's torchrun agent with two workers.
    --kill-on-bad-exit=1 as in slurm/*.sbatch: a lost trainer must not end the step (its keeper,
    not Slurm's task, sees it die)."""
    name = f"recovery-{uuid.uuid4().hex[:8]}"
    return ["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", f"--job-name={name}",
            PYTHON, "-m", "trainbox", "run", f"run_dir={run_dir}", *CONFIG]  # fmt: skip


def tail(job: Job, cluster: SlurmCluster) -> str:
    return f"{job.output[-6000:]}\n{cluster.diagnostics()}"


def recoveries(run_dir: Path) -> list[dict[str, Any]]:
    """The `kind: recovery` records of a run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["kind"] == "recovery"]


def noticed_at(output: str) -> dict[int, datetime.datetime]:
    """When each survivor logged that it lost a peer, by rank (the spare logs no such line).
    One clock for all: both nodes are this machine."""
    found: dict[int, datetime.datetime] = {}
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # two tasks' lines can interleave
        if event.get("event") == "a peer was lost: re-forming the group":
            found[event["rank"]] = datetime.datetime.fromisoformat(event["timestamp"])
    return found


@pytest.fixture(scope="module")
def runs(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Both jobs side by side (one CPU of each node apiece): the cluster has room for both,
    and the module takes the time of one."""
    base = tmp_path_factory.mktemp("recovery")
    # The marker files must be where every node sees them; here every node is this machine.
    once = base / "once"
    fault = {"TRAINBOX_FAULT": f"kill:rank={KILLED_RANK}:step={KILLED_AFTER}",
             "TRAINBOX_FAULT_ONCE": str(once)}  # fmt: skip
    started = [
        (base / "reference", slurm_cluster.popen(srun(base / "reference"), env=ENV)),
        (base / "killed", slurm_cluster.popen(srun(base / "killed"), env=ENV | fault)),
    ]
    jobs = []
    try:
        for run_dir, proc in started:
            output = proc.communicate(timeout=TIMEOUT_S)[0]
            jobs.append(Job(run_dir, proc.returncode, output))
    finally:
        for _, proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reference, killed = jobs
    assert reference.returncode == 0, tail(reference, slurm_cluster)
    return Runs(reference=reference, killed=killed, once=once)


def test_a_killed_trainer_on_the_second_node_does_not_end_the_job(
    runs: Runs, slurm_cluster: SlurmCluster
) -> None:
    assert runs.once.with_name("once.0").exists(), "the kill never fired"
    assert runs.killed.returncode == 0, tail(runs.killed, slurm_cluster)


def test_rank_0_records_the_recovery_with_the_rank_and_its_node(
    runs: Runs, slurm_cluster: SlurmCluster
) -> None:
    (record,) = recoveries(runs.killed.run_dir)
    want = {"rank": KILLED_RANK, "node": slurm_cluster.nodes[1], "cause": "SIGKILL",
            "generation": 1, "step": KILLED_AFTER + 1}  # fmt: skip
    assert {key: record[key] for key in want} == want, record
    # Killed right after its optimizer step: at most the step in flight is trained again.
    assert record["steps_retrained"] <= 1, record


def test_the_recovery_waits_out_no_timeout(runs: Runs) -> None:
    (record,) = recoveries(runs.killed.run_dir)
    assert record["seconds"] < DIST_TIMEOUT_S, record


def test_every_survivor_sets_about_re_forming_at_once(runs: Runs) -> None:
    """A survivor's stop vote may be in an all-reduce that waits on other survivors, not on the
    dead rank; it ends when they close the vote's group. Survivors that kept that group open as
    they left held the others' leaving until their wait for the vote gave up (ABORT_WAIT_S),
    and the whole recovery with it."""
    noticed = noticed_at(runs.killed.output)
    assert sorted(noticed) == [0, 1, 2], runs.killed.output[-3000:]
    spread = (max(noticed.values()) - min(noticed.values())).total_seconds()
    assert spread < ABORT_WAIT_S, noticed


def test_the_summary_counts_one_recovery(runs: Runs) -> None:
    got = summary(runs.killed.run_dir)
    assert (got["steps"], got["world_size"], got["recoveries"]) == (40, 4, 1)


def test_the_recovered_job_ends_with_the_uninterrupted_jobs_parameters(runs: Runs) -> None:
    got, want = summary(runs.killed.run_dir), summary(runs.reference.run_dir)
    assert want["recoveries"] == 0
    assert got["params_sha256"] == want["params_sha256"]
