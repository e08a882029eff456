"""Preemption, requeue and killed ranks on the real two-node Slurm cluster: nothing is lost.

1. `srun` preempted with `scancel --signal=USR1`: every task stops after one agreed step with a
   checkpoint and exit 143; the same srun again ends with the uninterrupted run's parameters.
2. Node mode under srun (each node's trainbox supervises torchrun with --max-restarts) with one
   worker SIGKILLed mid-run: torchrun restarts the workers on both nodes and they resume.

The sbatch scripts' own forwarding of USR1 and requeue run in the image, as users run them
(tests/container/test_slurm_scripts.py); test 1 proves the resumed parameters exact under Slurm.

Test 1 runs one task per node (world size 2): on the 2-CPU fake nodes that starts faster
than two per node, and only up to two ranks is a resumed run bit-exact today (see
test_node_mode_resume_after_a_kill_is_bit_exact).
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from launchers.slurm_cluster import SlurmCluster
from runs import summary

pytestmark = pytest.mark.slow

PYTHON = sys.executable
# Added to the cluster's client env (caller's env minus Slurm's, venv first on PATH).
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# Generous for one srun on a loaded 2-core box; a run here takes 10-30 s.
TIMEOUT_S = 180

CKPT_EVERY = 7
MAX_STEPS = 200
NODE_MAX_STEPS = 100


def config(max_steps: int) -> list[str]:
    """Wide layers, so a step takes milliseconds and a stop lands mid-run; a fixed max_steps,
    so the LR schedule does not depend on when the stop came; evaluation only at the end."""
    return [
        f"train.max_steps={max_steps}",
        "train.log_every=5",
        "train.eval_every=0",
        f"train.ckpt_every={CKPT_EVERY}",
        "train.keep_last=3",
        "model.args.hidden=512",
        "dist.timeout_s=30",
    ]


CONFIG = config(MAX_STEPS)
# Node mode: one srun task per node, each the supervisor of its node's torchrun (world size 4).
NODE_CONFIG = [*config(NODE_MAX_STEPS), "dist.procs_per_node=2", "dist.max_restarts=2"]

# Test 3's fault is drawn from this seed: random per session, fixed with TRAINBOX_TEST_SEED=N.
SEED = int(os.environ.get("TRAINBOX_TEST_SEED") or random.SystemRandom().randrange(2**32))


def srun(name: str, run_dir: Path, overrides: list[str]) -> list[str]:
    """One task on each of the two nodes, running `python -m trainbox run`."""
    return ["srun", "-N2", "--ntasks-per-node=1", f"--job-name={name}",
            PYTHON, "-m", "trainbox", "run", f"run_dir={run_dir}", *overrides]  # fmt: skip


def unique(prefix: str) -> str:
    """A job name no other job of this session has."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def events(text: str, name: str) -> list[dict[str, Any]]:
    """The JSON log events called `name` in a run's merged output."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # two tasks' lines can interleave
            if event.get("event") == name:
                found.append(event)
    return found


def stopped_steps(text: str) -> list[int]:
    """The step of each `trainbox: stopped after step N (SIGUSR1)` line (one per task)."""
    return [int(n) for n in re.findall(r"^trainbox: stopped after step (\d+) \(SIGUSR1\)", text, re.M)]  # fmt: skip


def last_record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def checkpoint(run_dir: Path, step: int) -> dict[str, Any]:
    """The checkpoint of `step`, loaded the way resume loads it (weights only)."""
    path = run_dir / "checkpoints" / f"step-{step:08d}.pt"
    assert path.with_name(f"{path.name}.sha256").is_file(), f"{path} has no .sha256 sidecar"
    payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return payload


def resumed_from(run_dir: Path) -> str | None:
    resumed: str | None = json.loads((run_dir / "run.json").read_text())["resumed_from"]
    return resumed


def tail(text: str, cluster: SlurmCluster, job: int | None = None) -> str:
    return f"{text[-6000:]}\n{cluster.diagnostics(job)}"


class Stream:
    """A background client command whose merged output is read line by line on a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, wanted: Callable[[str], bool], *, timeout: float) -> str | None:
        """The first line from now on that is `wanted`; None at end of output or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                return None
            if line is None:
                return None
            if wanted(line):
                return line

    def finish(self, *, timeout: float) -> int:
        """Wait for the command's exit (killing it after `timeout`); its exit code."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=30)
        return code

    @property
    def text(self) -> str:
        return "".join(self.lines)


def is_event(name: str) -> Callable[[str], bool]:
    return lambda line: line.startswith("{") and bool(events(line, name))


@pytest.fixture(scope="module")
def reference2(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted world-size-2 run: one task per node under srun."""
    run_dir = tmp_path_factory.mktemp("reference2")
    proc = slurm_cluster.run(srun(unique("ref2"), run_dir, CONFIG), env=ENV, timeout=TIMEOUT_S)
    assert proc.returncode == 0, tail(proc.stdout + proc.stderr, slurm_cluster)
    return run_dir


@pytest.fixture(scope="module")
def reference4(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted node-mode run: two workers on each of two nodes, world size 4."""
    run_dir = tmp_path_factory.mktemp("reference4")
    argv = srun(unique("ref4"), run_dir, NODE_CONFIG)
    proc = slurm_cluster.run(argv, env=ENV, timeout=TIMEOUT_S)
    assert proc.returncode == 0, tail(proc.stdout + proc.stderr, slurm_cluster)
    return run_dir


def test_srun_preempted_with_usr1_stops_at_a_checkpoint_and_resumes(
    slurm_cluster: SlurmCluster, reference2: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    name = unique("preempt")
    argv = srun(name, run_dir, CONFIG)
    stream = Stream(slurm_cluster.popen(argv, env=ENV))
    try:
        first = stream.wait_for(is_event("checkpoint"), timeout=TIMEOUT_S)
        assert first is not None, f"no checkpoint logged\n{tail(stream.text, slurm_cluster)}"
        (job,) = slurm_cluster.job_ids(name)
        # Without --batch: to every task of every step of the job (an srun job has no batch shell).
        sent = slurm_cluster.run(["scancel", "--signal=USR1", str(job)], timeout=30)
        assert sent.returncode == 0, sent.stderr
        code = stream.finish(timeout=TIMEOUT_S)
    finally:
        if stream.proc.poll() is None:
            stream.proc.kill()
            slurm_cluster.run(["scancel", f"--name={name}"], timeout=30)
    text = stream.text
    # srun exits with the highest exit code of its tasks: both said 143, and srun says so.
    assert code == 143, tail(text, slurm_cluster, job)
    assert "srun: error: n1: task 0: Exited with exit code 143" in text, text[-3000:]
    assert "srun: error: n2: task 1: Exited with exit code 143" in text, text[-3000:]
    record = last_record(run_dir)
    step = record["step"]
    assert (record["kind"], record["reason"]) == ("stop", "SIGUSR1"), record
    # After the first checkpoint, which came before the signal, and well before the end.
    assert events(first, "checkpoint")[0]["step"] == CKPT_EVERY
    assert CKPT_EVERY < step < MAX_STEPS, f"stopped at {step}: the signal did not land mid-run"
    assert stopped_steps(text) == [step, step], text[-3000:]
    assert checkpoint(run_dir, step)["step"] == step
    assert not (run_dir / "summary.json").exists()

    proc = slurm_cluster.run(argv, env=ENV, timeout=TIMEOUT_S)
    assert proc.returncode == 0, tail(proc.stdout + proc.stderr, slurm_cluster)
    assert resumed_from(run_dir) == str(run_dir / "checkpoints" / f"step-{step:08d}.pt")
    got, want = summary(run_dir), summary(reference2)
    assert (got["steps"], got["world_size"]) == (MAX_STEPS, 2)
    assert got["params_sha256"] == want["params_sha256"]


@dataclass(frozen=True)
class NodeKill:
    """The node-mode run with one worker killed, and how to replay it."""

    run_dir: Path
    proc: subprocess.CompletedProcess[str]
    rank: int
    step: int
    once: Path
    replay: str


@pytest.fixture(scope="module")
def node_kill(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> NodeKill:
    base = tmp_path_factory.mktemp("node-kill")
    rng = random.Random(SEED)
    # Any of the 4 ranks, after some optimizer step past the first checkpoint, before the last.
    rank, step = rng.randrange(4), rng.randrange(CKPT_EVERY + 1, NODE_MAX_STEPS)
    fault = f"kill:rank={rank}:step={step}"
    replay = f"(TRAINBOX_TEST_SEED={SEED}: TRAINBOX_FAULT={fault})"
    print(f"node-mode kill {replay}")
    env = {**ENV, "TRAINBOX_FAULT": fault, "TRAINBOX_FAULT_ONCE": str(base / "once")}
    run_dir = base / "run"
    proc = slurm_cluster.run(srun(unique("kill"), run_dir, NODE_CONFIG), env=env, timeout=TIMEOUT_S)
    return NodeKill(run_dir, proc, rank, step, base / "once", replay)


def test_node_mode_under_srun_restarts_a_killed_worker_and_resumes(
    slurm_cluster: SlurmCluster, node_kill: NodeKill, reference4: Path
) -> None:
    proc, replay, run_dir = node_kill.proc, node_kill.replay, node_kill.run_dir
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{replay}\n{tail(text, slurm_cluster)}"
    assert node_kill.once.with_name("once.0").exists(), f"the fault never fired {replay}"
    # The victim's agent saw it die of SIGKILL and restarted its workers.
    assert "(exitcode: -9)" in text, f"{replay}\n{text[-3000:]}"
    # Killed right after step S, before any checkpoint of S: all four resume from the one before.
    newest = CKPT_EVERY * ((node_kill.step - 1) // CKPT_EVERY)
    resumed = sorted((e["rank"], e["step"]) for e in events(text, "resumed"))
    assert resumed == [(rank, newest) for rank in range(4)], f"{replay}\n{text[-3000:]}"
    assert resumed_from(run_dir) == str(run_dir / "checkpoints" / f"step-{newest:08d}.pt")
    got = summary(run_dir)
    assert (got["steps"], got["world_size"], got["launcher"]) == (NODE_MAX_STEPS, 4, "torchrun")
    # Nothing lost: bit for bit the uninterrupted run (DDP's buckets are settled at every start).
    assert got["params_sha256"] == summary(reference4)["params_sha256"], replay
