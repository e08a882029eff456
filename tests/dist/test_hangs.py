"""A rank that stops making progress ends the job with exit 4 within dist.timeout_s plus a
margin, and the message names the rank and the operation it was stuck in; each rank leaves its
stacks in run_dir/hang/, which `trainbox hang` reads.

Two real processes started by hand (the `env` launcher), so each one's exit code is seen.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from freeport import free_port
from runs import QUICK, clean_env, train, trainbox_argv

pytestmark = pytest.mark.slow

TIMEOUT_S = 5
CONFIG = [*QUICK, "model.args.hidden=512", "train.log_every=1", f"dist.timeout_s={TIMEOUT_S}"]
# Heartbeats every second at this timeout; the rest is process exit and start-up jitter.
MARGIN_S = 15


def by_hand(run_dir: Path, fault: str) -> tuple[list[tuple[int, str]], float]:
    """Run two ranks with TRAINBOX_FAULT set; their (exit code, stderr) and the seconds from
    the last step either rank logged to the last exit."""
    port = str(free_port())
    ranks = []
    for rank in (0, 1):
        env = clean_env(
            RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TRAINBOX_FAULT=fault, PYTHONUNBUFFERED="1",
        )  # fmt: skip
        argv = trainbox_argv(1, "run", f"run_dir={run_dir}", *CONFIG)
        ranks.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    outputs = [proc.communicate(timeout=180)[1] for proc in ranks]
    ended = time.time()
    last_step = max(
        json.loads(line)["timestamp"]
        for text in outputs
        for line in text.splitlines()
        if line.startswith("{") and json.loads(line).get("event") == "step"
    )
    # Log timestamps are ISO UTC; compare on the same clock.
    from datetime import datetime

    stalled_for = ended - datetime.fromisoformat(last_step.replace("Z", "+00:00")).timestamp()
    return [(proc.returncode, text) for proc, text in zip(ranks, outputs, strict=True)], stalled_for


def error_line(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.startswith("trainbox: error:")]
    return line


@pytest.fixture(scope="module")
def stalled_in_data(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[tuple[int, str]], float]:
    """One run where rank 1 stalls in data loading before step 11 and rank 0 waits for it in
    the gradient all-reduce: its run_dir, each rank's (exit code, stderr), the stall's length."""
    run_dir = tmp_path_factory.mktemp("stalled")
    results, stalled_for = by_hand(run_dir, "stall:rank=1:step=11")
    return run_dir, results, stalled_for


def test_a_stalled_rank_ends_both_with_exit_4_naming_it(
    stalled_in_data: tuple[Path, list[tuple[int, str]], float],
) -> None:
    _, results, stalled_for = stalled_in_data
    assert [code for code, _ in results] == [4, 4], results[0][1][-2000:] + results[1][1][-2000:]
    waiting, stalled = error_line(results[0][1]), error_line(results[1][1])
    # Rank 0's collective timed out after dist.timeout_s; it blames rank 1 and says where.
    # gloo words its timeout two ways: "Timed out waiting Nms" or "Application timeout caused
    # pair closure" (CI saw both); either is the collective giving up after dist.timeout_s.
    assert f"Timed out waiting {TIMEOUT_S * 1000}ms" in waiting or "Application timeout" in waiting
    assert "rank 1 (" in waiting
    assert "in data loading at step 11" in waiting
    # Rank 1 was stuck outside any collective: only the watchdog can end it.
    assert stalled.startswith("trainbox: error: rank 1 (")
    assert f"in data loading at step 11 (dist.timeout_s={TIMEOUT_S})" in stalled
    assert "HINT: " in waiting
    assert "HINT: " in stalled
    assert stalled_for < TIMEOUT_S + MARGIN_S, f"took {stalled_for:.1f} s after the stall"


def test_each_rank_leaves_every_threads_stack_in_run_dir(
    stalled_in_data: tuple[Path, list[tuple[int, str]], float],
) -> None:
    run_dir, _, _ = stalled_in_data
    files = sorted(path.name for path in (run_dir / "hang").iterdir())
    assert files == ["rank-00000.txt", "rank-00001.txt"]
    stalled = (run_dir / "hang" / "rank-00001.txt").read_text()
    assert "op: data loading" in stalled
    # The main thread asleep in the injected stall, and the watchdog thread that wrote it.
    assert "Thread MainThread" in stalled
    assert "testing/faults.py" in stalled
    assert "Thread trainbox-watchdog" in stalled


def test_trainbox_hang_names_the_stalled_rank_and_where_the_other_waited(
    stalled_in_data: tuple[Path, list[tuple[int, str]], float],
) -> None:
    run_dir, _, _ = stalled_in_data
    proc = subprocess.run(
        trainbox_argv(1, "hang", str(run_dir)), env=clean_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("verdict: rank 1 ("), proc.stdout
    (stalled,) = [line for line in lines if line.startswith("rank 1: ")]
    (waiting,) = [line for line in lines if line.startswith("rank 0: ")]
    assert "in data loading at step 11, at testing/faults.py:" in stalled, proc.stdout
    # Rank 0 was in the step's backward (the all-reduce runs inside it) when gloo gave up.
    assert "at step 11, at train/" in waiting, proc.stdout
    # Both were in the loop's step; their stacks part inside it.
    assert any(line.startswith("first difference after train/loop.py:") for line in lines)


def test_a_rank_stuck_in_a_collective_is_named_by_the_other(tmp_path: Path) -> None:
    # Rank 0 stalls inside the step; rank 1 waits in the gradient all-reduce.
    results, stalled_for = by_hand(tmp_path, "stall:rank=0:step=15")
    assert [code for code, _ in results] == [4, 4], results[0][1][-2000:] + results[1][1][-2000:]
    assert "rank 0 (" in error_line(results[1][1])
    assert "at step 15" in error_line(results[1][1])
    assert stalled_for < TIMEOUT_S + MARGIN_S


def test_node_mode_reports_exit_4_for_a_stall(tmp_path: Path) -> None:
    proc = train(
        tmp_path,
        *CONFIG,
        "dist.procs_per_node=2",
        env={"TRAINBOX_FAULT": "stall:rank=1:step=11"},
        check=False,
    )
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "in data loading at step 11" in proc.stderr
