"""Straggler detection in real 4-rank torchrun runs on 2 CPUs: a rank slowed by
TRAINBOX_FAULT=slow, or stopped and continued by a watcher process (TRAINBOX_FAULT=pause, a
descheduled VM seen from outside), is named, with its host and the right cause, within 3 log
windows; a healthy run of 3,000 oversubscribed steps names no rank."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import pytest

from runs import train

pytestmark = pytest.mark.slow

LOG_EVERY = 20
# The rank slowed, and the step its slowdown starts at: mid-window, the harder case.
SLOW_RANK, FROM = 2, 51
# The tiny model: a step is a few milliseconds, so the run is short in wall time.
TINY = ["model.args.hidden=16", "model.args.layers=1", "train.batch_size=16",
        "train.eval_every=0", "train.ckpt_every=0"]  # fmt: skip


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def warnings(stderr: str) -> list[dict[str, Any]]:
    """The straggler warnings every rank logged (JSON lines)."""
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [event for event in events if event.get("event") == "straggler"]


# (where the fault adds its 20 ms, the cause named, the train line's maximum that shows it)
WHERE = [("compute", "compute", "compute_s_max"), ("data", "data wait", "data_s_max")]


@pytest.mark.parametrize(("where", "cause", "maximum"), WHERE, ids=["compute", "data"])
def test_a_slowed_rank_is_named_with_its_host_within_three_windows(
    tmp_path: Path, where: str, cause: str, maximum: str
) -> None:
    fault = f"slow:rank={SLOW_RANK}:ms=20:from={FROM}:where={where}"
    steps = FROM - 1 + 4 * LOG_EVERY
    proc = train(tmp_path, *TINY, f"train.max_steps={steps}", f"train.log_every={LOG_EVERY}",
                 nproc=4, env={"TRAINBOX_FAULT": fault})  # fmt: skip
    (named,) = records(tmp_path, "straggler")
    assert (named["rank"], named["host"], named["cause"]) == (SLOW_RANK, platform.node(), cause)
    delay = (named["step"] - (FROM - 1)) / LOG_EVERY
    assert delay <= 3, f"named at step {named['step']}, {delay} windows after the slowdown"
    assert named["ratio"] > 1.5
    (warned,) = warnings(proc.stderr)
    assert warned["rank"] == SLOW_RANK, "the slow rank warns about itself"
    assert f"rank {SLOW_RANK} ({platform.node()})" in warned["message"]
    assert warned["cpus"], "the warning names the rank's CPU set"
    # Train lines that end a judged window, all of whose steps were slowed.
    slowed = [r for r in records(tmp_path, "train") if r["step"] - LOG_EVERY >= FROM - 1
              and maximum in r]  # fmt: skip
    assert slowed
    assert all(r[maximum] >= 0.019 for r in slowed), "the train lines show the slow rank's time"


# Rank 2 stopped (SIGSTOP) for 200 ms of every 250 ms from step FROM: mostly while it sits in
# the gradient all-reduce, where everyone waits with it and its own work looks normal. Any 20
# steps then hold at least one stop, so every window shows it.
PAUSE = f"pause:rank={SLOW_RANK}:ms=200:every=250:from={FROM}"


def test_a_paused_rank_is_named_as_paused_within_three_windows(tmp_path: Path) -> None:
    steps = FROM - 1 + 4 * LOG_EVERY
    proc = train(tmp_path, *TINY, f"train.max_steps={steps}", f"train.log_every={LOG_EVERY}",
                 nproc=4, env={"TRAINBOX_FAULT": PAUSE})  # fmt: skip
    (named,) = records(tmp_path, "straggler")
    assert (named["rank"], named["host"], named["cause"]) == (SLOW_RANK, platform.node(), "paused")
    delay = (named["step"] - (FROM - 1)) / LOG_EVERY
    assert delay <= 3, f"named at step {named['step']}, {delay} windows after the pauses began"
    assert named["paused_s"] > named["compute_s"], "its time went to the pauses"
    (warned,) = warnings(proc.stderr)
    assert warned["rank"] == SLOW_RANK, "the paused rank warns about itself"
    assert "likely cause: paused" in warned["message"]
    # Every judged window after the first stop: rank 2 is the rank the others waited for.
    paused = [r for r in records(tmp_path, "train") if r["step"] - LOG_EVERY >= FROM
              and "slowest_rank" in r]  # fmt: skip
    assert paused
    assert all(r["slowest_rank"] == SLOW_RANK for r in paused)
    assert all(r["paused_s_max"] > 0.005 > r["paused_s_p50"] for r in paused)


def test_a_healthy_oversubscribed_run_names_no_straggler(tmp_path: Path) -> None:
    proc = train(tmp_path, *TINY, "train.max_steps=3000", "train.log_every=50", nproc=4)
    assert records(tmp_path, "straggler") == []
    assert warnings(proc.stderr) == []
    lines = records(tmp_path, "train")
    assert len(lines) == 60
    assert all(r["compute_s_min"] <= r["compute_s_p50"] <= r["compute_s_max"] for r in lines)
