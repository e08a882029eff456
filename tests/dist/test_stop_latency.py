"""A stop lands within about max(0.5 s, 2 steps) of the signal, whatever came before it.

Real runs in node mode (trainbox supervising torchrun with 2 workers, so the exit is 143); rank 1 alone receives SIGUSR1 (a TRAINBOX_FAULT
signal after a given step). The latency is read from metrics.jsonl (a record per step, each
with its time): from the step after which the signal was sent to the step the run stopped at.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runs import train

pytestmark = pytest.mark.slow

SLOWING = Path(__file__).parent / "slowing"
BASE = ["train.log_every=1", "train.eval_every=0", "train.ckpt_every=0", "train.keep_last=5",
        "optim.warmup_steps=0"]  # fmt: skip
# This 2-core machine runs two ranks and their gloo threads: allow it some scheduling noise.
SLACK_S = 0.5


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stopped_run(run_dir: Path, *overrides: str, signal_after: int) -> dict[str, Any]:
    fault = {"TRAINBOX_FAULT": f"signal:rank=1:step={signal_after}:sig=USR1"}
    proc = train(run_dir, *BASE, *overrides, "dist.procs_per_node=2", env=fault, check=False,
                 pythonpath=SLOWING)  # fmt: skip
    assert proc.returncode == 143, f"exit {proc.returncode}, not stopped\n{proc.stderr[-2000:]}"
    return latency(run_dir, signal_after)


def latency(run_dir: Path, signal_after: int) -> dict[str, Any]:
    """Steps and seconds from the signal to the stop, and the step time around it."""
    by_step = {r["step"]: r for r in records(run_dir) if r["kind"] == "train"}
    stop = next(r for r in reversed(records(run_dir)) if r["kind"] == "stop")
    step_time = by_step[signal_after]["step_time_s"]
    return {
        "steps": stop["step"] - signal_after,
        "seconds": by_step[stop["step"]]["time"] - by_step[signal_after]["time"],
        "step_time": step_time,
        "stop": stop["step"],
    }


def assert_prompt(measured: dict[str, Any]) -> None:
    allowed = max(0.5, 2 * measured["step_time"]) + SLACK_S
    assert measured["seconds"] <= allowed, measured
    assert measured["steps"] >= 0, measured


def test_a_stop_after_resumes_is_as_prompt_as_on_a_fresh_run(tmp_path: Path) -> None:
    config = ["train.max_steps=3000", "model.args.hidden=256"]
    # Fresh, then resumed: each run is stopped by a signal and the next resumes from it.
    previous = 0
    for signal_after in (150, 400):
        measured = stopped_run(tmp_path, *config, signal_after=signal_after)
        assert_prompt(measured)
        assert measured["stop"] > previous
        previous = measured["stop"]


def test_a_stop_is_prompt_after_the_steps_turn_slow(tmp_path: Path) -> None:
    # 400 quick steps (~1 ms) teach a schedule counted in steps a long period; then 60 ms steps,
    # and the signal comes with the first slow one.
    slowing = ["model.factory=slowing_model:model", "model.args.after=400", "model.args.hidden=16",
               "model.args.sleep_s=0.06", "train.max_steps=600"]  # fmt: skip
    measured = stopped_run(tmp_path, *slowing, signal_after=401)
    assert measured["step_time"] >= 0.05
    assert_prompt(measured)


def test_a_signal_during_an_eval_stops_right_after_it(tmp_path: Path) -> None:
    # The signal comes after step 200, whose eval then takes seconds (20 batches of 0.1 s).
    slow_eval = ["model.factory=slowing_model:model", "model.args.eval_sleep_s=0.1",
                 "train.max_steps=3000", "train.eval_every=200", "data.args.val_size=1280"]  # fmt: skip
    measured = stopped_run(tmp_path, *slow_eval, signal_after=200)
    by_step = {r["step"]: r for r in records(tmp_path) if r["kind"] == "val"}
    assert 200 in by_step
    # Within two steps of the eval's end, and no new eval reached.
    assert measured["steps"] <= 3, measured
