"""Preemption: a stop signal or the Slurm deadline ends every rank at one agreed step, with a
checkpoint and exit 143; running the same command again finishes the run bit for bit.

Real runs: `trainbox run dist.procs_per_node=2` (node mode: the supervisor reports the workers'
exit code), plain torchrun, and one process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from runs import QUICK, clean_env, shared_run, summary, train, trainbox_argv, until_first_checkpoint

pytestmark = pytest.mark.slow

# Wide, so a step takes milliseconds and a stop lands mid-run.
CONFIG = [*QUICK, "model.args.hidden=512", "train.max_steps=60"]
NODE_MODE = "dist.procs_per_node=2"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted two-process run (test_ctrl_c's too)."""
    return shared_run(tmp_path_factory, *CONFIG, nproc=2)


def last_record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def checkpoint_step(run_dir: Path, step: int) -> int:
    """Load the checkpoint of `step` (it must be whole) and return the step it records."""
    path = run_dir / "checkpoints" / f"step-{step:08d}.pt"
    return int(torch.load(path, map_location="cpu", weights_only=True)["step"])


@pytest.mark.parametrize("sig", ["USR1", "TERM"])
def test_a_signal_on_one_rank_stops_both_after_the_next_step(
    reference: Path, tmp_path: Path, sig: str
) -> None:
    fault = {"TRAINBOX_FAULT": f"signal:rank=1:step=30:sig={sig}"}
    proc = train(tmp_path, *CONFIG, NODE_MODE, env=fault, check=False)
    assert proc.returncode == 143, proc.stderr[-3000:]
    # The signal comes after step 30's optimizer step, while the loop is still inside step 30 as
    # the vote thread sees it: the next vote (~0.1 s later) agrees on step 30 itself when it
    # samples before the loop finishes that step, else on a later one.
    record = last_record(tmp_path)
    stop = record["step"]
    assert (record["kind"], record["reason"]) == ("stop", f"SIG{sig}")
    assert 30 <= stop < 60
    assert checkpoint_step(tmp_path, stop) == stop
    assert not (tmp_path / "summary.json").exists()
    # Both workers, each having received or not received the signal, stopped after that step.
    assert proc.stderr.count(f"trainbox: stopped after step {stop} (SIG{sig})") == 2
    train(tmp_path, *CONFIG, NODE_MODE)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]


def test_sigterm_to_torchrun_checkpoints_and_the_rerun_matches(
    reference: Path, tmp_path: Path
) -> None:
    argv = trainbox_argv(2, "run", f"run_dir={tmp_path}", *CONFIG)
    agent = subprocess.Popen(
        argv, env=clean_env(PYTHONUNBUFFERED="1"), stderr=subprocess.PIPE, text=True
    )
    if until_first_checkpoint(agent):
        agent.send_signal(signal.SIGTERM)
    assert agent.stderr is not None
    rest = agent.stderr.read()
    agent.wait(timeout=60)
    # torchrun's agent passes TERM to its workers, which save and exit 143; torchrun itself
    # dies of the signal (exit 1): node mode is what maps that to 143 for a scheduler.
    assert agent.returncode != 0
    record = last_record(tmp_path)
    assert (record["kind"], record["reason"]) == ("stop", "SIGTERM"), rest[-3000:]
    assert 7 <= record["step"] < 60
    assert checkpoint_step(tmp_path, record["step"]) == record["step"]
    # Both workers said so on their way out (each prints the line before exiting 143).
    assert rest.count(f"trainbox: stopped after step {record['step']} (SIGTERM)") == 2
    train(tmp_path, *CONFIG, nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]


def test_the_supervisor_forwards_sigterm_and_exits_143(tmp_path: Path) -> None:
    # As `docker stop` or the kubelet would: TERM to the container's one trainbox process.
    argv = trainbox_argv(
        1, "run", f"run_dir={tmp_path}", *CONFIG, "train.max_steps=100000", NODE_MODE
    )
    node = subprocess.Popen(
        argv, env=clean_env(PYTHONUNBUFFERED="1"), stderr=subprocess.PIPE, text=True
    )
    if until_first_checkpoint(node):
        node.send_signal(signal.SIGTERM)
    assert node.stderr is not None
    rest = node.stderr.read()
    assert node.wait(timeout=60) == 143, rest[-3000:]
    record = last_record(tmp_path)
    assert (record["kind"], record["reason"]) == ("stop", "SIGTERM")
    assert checkpoint_step(tmp_path, record["step"]) == record["step"]


def test_the_slurm_deadline_stops_one_process_with_143(tmp_path: Path) -> None:
    # A job that ends 30 s from now, with a 12 s margin: the run must stop about 18 s in, well
    # after a start-up that takes 3 s on an idle machine and over 6 s at a load of 12.
    end = time.time() + 30
    started = time.monotonic()
    proc = train(
        tmp_path, *CONFIG, "train.max_steps=100000", "train.deadline_margin_s=12",
        env={"SLURM_JOB_END_TIME": str(int(end))}, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 143, proc.stderr[-3000:]
    record = last_record(tmp_path)
    assert (record["kind"], record["reason"]) == ("stop", "deadline")
    assert 0 < record["step"] < 100000
    assert checkpoint_step(tmp_path, record["step"]) == record["step"]
    assert elapsed < 30, "the run went on past the deadline"


def test_in_node_mode_the_supervisor_keeps_the_deadline(tmp_path: Path) -> None:
    # The supervisor signals 20 s in: node mode starts an agent and two workers, which took
    # over 8 s on a 2-core CI machine running another test beside it, and a deadline that
    # comes before the first step leaves nothing to check.
    end = time.time() + 30
    proc = train(
        tmp_path, *CONFIG, "train.max_steps=100000", "train.deadline_margin_s=10", NODE_MODE,
        env={"SLURM_JOB_END_TIME": str(int(end))}, check=False,
    )  # fmt: skip
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "deadline reached" in proc.stderr
    # The supervisor signals its agent, which passes TERM on: workers never race it.
    record = last_record(tmp_path)
    assert (record["kind"], record["reason"]) == ("stop", "SIGTERM")
    assert checkpoint_step(tmp_path, record["step"]) == record["step"]
