"""A rank that stops making progress ends the job with exit 4 within dist.timeout_s plus a
margin, and the message names the rank and the operation it was stuck in.

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


def test_a_stalled_rank_ends_both_with_exit_4_naming_it(tmp_path: Path) -> None:
    results, stalled_for = by_hand(tmp_path, "stall:rank=1:step=11")
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
