"""Ctrl-C stops a run like SIGTERM: at one agreed step, with a checkpoint, and the rerun
finishes bit for bit; a second Ctrl-C aborts at once (issue 19, item 7).

Ctrl-C is emulated as a terminal sends it: SIGINT to every process of the foreground group.
Real runs: one process, torchrun --standalone with 2 workers, and node mode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from trainbox.process import preempt

from runs import QUICK, clean_env, shared_run, summary, train, trainbox_argv, until_first_checkpoint

pytestmark = pytest.mark.slow

# Wide, so a step takes milliseconds and a stop lands mid-run.
CONFIG = [*QUICK, "model.args.hidden=512", "train.max_steps=60"]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """params_sha256 of the uninterrupted run, by number of processes."""
    # The two-process one is test_preemption's too.
    return {nproc: summary(shared_run(tmp_path_factory, *CONFIG, nproc=nproc))["params_sha256"]
            for nproc in (1, 2)}  # fmt: skip


def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    # A session of its own: the test plays the terminal, whose Ctrl-C reaches the whole group.
    environment = clean_env(PYTHONUNBUFFERED="1") | (env or {})
    return subprocess.Popen(
        argv, env=environment, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def ctrl_c(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGINT)


def ctrl_c_after_first_checkpoint(proc: subprocess.Popen[str]) -> str:
    """Press Ctrl-C once training is under way; the rest of stderr once the job has ended."""
    if until_first_checkpoint(proc):
        ctrl_c(proc)
    assert proc.stderr is not None
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    return rest


def stop_record(run_dir: Path) -> dict[str, Any]:
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert (record["kind"], record["reason"]) == ("stop", "SIGINT")
    # The checkpoint of the stop step is whole and says so.
    path = run_dir / "checkpoints" / f"step-{record['step']:08d}.pt"
    assert torch.load(path, map_location="cpu", weights_only=True)["step"] == record["step"]
    assert not (run_dir / "summary.json").exists()
    return record


def test_ctrl_c_stops_one_process_at_a_checkpoint_and_the_rerun_matches(
    references: dict[int, str], tmp_path: Path
) -> None:
    proc = start(trainbox_argv(1, "run", f"run_dir={tmp_path}", *CONFIG))
    rest = ctrl_c_after_first_checkpoint(proc)
    assert proc.returncode == 143, rest[-3000:]
    stop = stop_record(tmp_path)["step"]
    said = [line for line in rest.splitlines() if not line.startswith("{")]
    assert said[0].startswith("trainbox: Ctrl-C: stopping after the next agreed step")
    assert said[-1].startswith(f"trainbox: stopped after step {stop} (SIGINT)")
    assert "Traceback" not in rest
    train(tmp_path, *CONFIG)
    assert summary(tmp_path)["params_sha256"] == references[1]


def test_ctrl_c_under_torchrun_stops_both_workers_at_one_step(
    references: dict[int, str], tmp_path: Path
) -> None:
    proc = start(trainbox_argv(2, "run", f"run_dir={tmp_path}", *CONFIG))
    rest = ctrl_c_after_first_checkpoint(proc)
    # torchrun's agent passes INT to its workers (their own session, so they get it once),
    # which save and exit 143; torchrun itself dies of the signal (exit 1, its own traceback).
    assert proc.returncode != 0
    stop = stop_record(tmp_path)["step"]
    assert rest.count(f"trainbox: stopped after step {stop} (SIGINT)") == 2, rest[-3000:]
    assert "KeyboardInterrupt" not in rest
    train(tmp_path, *CONFIG, nproc=2)
    assert summary(tmp_path)["params_sha256"] == references[2]


def test_ctrl_c_in_node_mode_exits_143(tmp_path: Path) -> None:
    proc = start(trainbox_argv(1, "run", f"run_dir={tmp_path}", *CONFIG, "dist.procs_per_node=2"))
    rest = ctrl_c_after_first_checkpoint(proc)
    assert proc.returncode == 143, rest[-3000:]
    stop = stop_record(tmp_path)["step"]
    assert rest.count(f"trainbox: stopped after step {stop} (SIGINT)") == 2


def test_a_second_ctrl_c_aborts_a_stuck_run_at_once(tmp_path: Path) -> None:
    # Rank 0 hangs before step 8, so the first Ctrl-C's stop can never land. A short watchdog
    # limit ends the run (exit 4) soon if a Ctrl-C goes unanswered, instead of after 600 s.
    proc = start(trainbox_argv(1, "run", f"run_dir={tmp_path}", *CONFIG, "dist.timeout_s=60"),
                 env={"TRAINBOX_FAULT": "stall:rank=0:step=8"})  # fmt: skip
    assert proc.stderr is not None
    seen = []  # what the run said before the second press, for the failure message
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("{") and json.loads(line).get("event") == "checkpoint":
            ctrl_c(proc)
        if line.startswith("trainbox: Ctrl-C: stopping"):
            break
    assert seen[-1].startswith("trainbox: Ctrl-C: stopping"), "".join(seen)[-4000:]
    # A person's second press, not torchrun's echo of the first.
    time.sleep(preempt.ECHO_S + 0.5)
    ctrl_c(proc)
    rest = proc.stderr.read()
    # Killed by the signal, which a shell reports as 130.
    assert proc.wait(timeout=30) == -signal.SIGINT, rest[-3000:]
    assert (
        rest.strip().splitlines()[-1]
        == "trainbox: Ctrl-C again: aborting now, without a checkpoint"
    )
