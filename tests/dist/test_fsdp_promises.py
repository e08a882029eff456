"""What DDP promises holds under train.strategy=fsdp: a stop signal on one rank stops both at one
step with a whole sharded checkpoint and exit 143, and the rerun ends bit for bit; a rank that
stalls mid-forward is named by the other with exit 4; a slow rank is named a straggler.

Real two-rank runs of the built-in task: node mode (`trainbox run dist.procs_per_node=2`, so the
supervisor's exit code is the workers'), plain torchrun, and ranks started by hand.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import pytest

from trainbox.checkpoint import shards

from runs import QUICK, by_hand, shared_run, summary, train

pytestmark = pytest.mark.slow

# tests/dist/test_fsdp.py's config, so its uninterrupted reference run serves here too.
CONFIG = [*QUICK, "train.strategy=fsdp", "train.batch_size=48", "train.grad_accum=2",
          "train.clip_grad_norm=0.5"]  # fmt: skip
NODE_MODE = "dist.procs_per_node=2"
STALLING = Path(__file__).parent / "stalling"


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def with_path(*paths: Path) -> dict[str, str]:
    """PYTHONPATH with `paths` first, keeping this checkout's (the runs import trainbox from it)."""
    return {"PYTHONPATH": os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])}


# -- preemption, the stop vote and requeue ---------------------------------------------------

# The stop signal to rank 1 after step 10 (USR1 takes the same path as TERM: one handler).
SIGTERM_AT_10 = {"TRAINBOX_FAULT": "signal:rank=1:step=10:sig=TERM"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted two-rank fsdp run (test_fsdp's)."""
    return shared_run(tmp_path_factory, *CONFIG, nproc=2)


@pytest.fixture(scope="module")
def requeued(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[subprocess.CompletedProcess[str]]]:
    """One run_dir stopped by SIGTERM on rank 1, then run again to its end, as a scheduler
    requeues a preempted job: the run_dir and both runs."""
    run_dir = tmp_path_factory.mktemp("requeued")
    stopped = train(run_dir, *CONFIG, NODE_MODE, env=SIGTERM_AT_10, check=False)
    return run_dir, [stopped, train(run_dir, *CONFIG, NODE_MODE, check=False)]


def test_a_signal_on_one_rank_stops_both_at_one_step_with_exit_143(
    requeued: tuple[Path, list[subprocess.CompletedProcess[str]]],
) -> None:
    run_dir, runs = requeued
    assert [run.returncode for run in runs] == [143, 0], runs[-1].stderr[-3000:]
    (stop,) = records(run_dir, "stop")
    assert stop["reason"] == "SIGTERM"
    # At a step boundary after the signalled step, before the end (40) and its checkpoint.
    assert 10 <= stop["step"] < 40
    # Both ranks, the signalled one and the other, stopped after that same step.
    said = f"trainbox: stopped after step {stop['step']} (SIGTERM)"
    assert runs[0].stderr.count(said) == 2, runs[0].stderr[-3000:]


def test_each_stop_leaves_a_whole_sharded_checkpoint_of_its_step(
    requeued: tuple[Path, list[subprocess.CompletedProcess[str]]],
) -> None:
    run_dir, _ = requeued
    for stop in records(run_dir, "stop"):
        path = shards.path_for(run_dir / "checkpoints", stop["step"])
        assert shards.check_alone(path) is None
        listed = json.loads((path / shards.MANIFEST).read_text())["files"]
        assert set(listed) == {"__0_0.distcp", "__1_0.distcp", ".metadata", "record.pt"}
        assert shards.read_record(path)["step"] == stop["step"]


def test_the_requeued_runs_end_as_the_uninterrupted_one(
    requeued: tuple[Path, list[subprocess.CompletedProcess[str]]], reference: Path
) -> None:
    run_dir, _ = requeued
    assert summary(run_dir)["params_sha256"] == summary(reference)["params_sha256"]
    (stop,) = records(run_dir, "stop")
    resumed = json.loads((run_dir / "run.json").read_text())["resumed_from"]
    assert resumed.endswith(f"step-{stop['step']:08d}.dcp")


# -- the hang watchdog ------------------------------------------------------------------------

TIMEOUT_S = 5
HANGS = [*QUICK, "train.strategy=fsdp", "train.log_every=1", f"dist.timeout_s={TIMEOUT_S}",
         "model.factory=stalling_model:model"]  # fmt: skip


def error_line(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.startswith("trainbox: error:")]
    return line


def test_a_rank_stalled_mid_forward_is_named_by_the_other_with_exit_4(tmp_path: Path) -> None:
    # Rank 1 stops between the first unit's forward and the second's: rank 0 waits in the
    # second unit's all-gather, inside the forward (under DDP it would wait after backward).
    env = with_path(STALLING) | {"PYTHONUNBUFFERED": "1"}
    results = by_hand("run", f"run_dir={tmp_path}", *HANGS, "model.args.rank=1",
                      "model.args.at=21", env=env)  # fmt: skip
    assert [code for code, _ in results] == [4, 4], results[0][1][-2000:] + results[1][1][-2000:]
    waiting, stalled = error_line(results[0][1]), error_line(results[1][1])
    where = "in forward/backward and the gradient all-reduce at step 21"
    assert "rank 1 (" in waiting
    assert where in waiting
    assert "HINT: " in waiting
    # Rank 1 is in no collective: its own watchdog ends it.
    assert stalled.startswith("trainbox: error: rank 1 (")
    assert f"{where} (dist.timeout_s={TIMEOUT_S})" in stalled
    assert "stalling_model.py" in (tmp_path / "hang" / "rank-00001.txt").read_text()


# -- fleet health: a straggler --------------------------------------------------------------

SLOW_RANK, FROM, LOG_EVERY = 1, 21, 20
TINY = ["train.strategy=fsdp", "model.args.hidden=16", "model.args.layers=1",
        "train.batch_size=16", "train.eval_every=0", "train.ckpt_every=0"]  # fmt: skip


def test_a_rank_slow_in_its_own_work_is_named_a_straggler(tmp_path: Path) -> None:
    # Under fsdp the healthy rank waits for the slow one in the all-gathers of forward and
    # backward, not in a gradient all-reduce at the end of backward: that wait is not its work.
    # 150 ms a step, several times the healthy rank's own ~20 ms: on a loaded 2-CPU machine
    # the scheduler stretches both ranks' own time alike, and 40 ms once fell under the factor.
    fault = f"slow:rank={SLOW_RANK}:ms=150:from={FROM}"
    train(tmp_path, *TINY, f"train.max_steps={FROM - 1 + 3 * LOG_EVERY}",
          f"train.log_every={LOG_EVERY}", nproc=2, env={"TRAINBOX_FAULT": fault})  # fmt: skip
    (named,) = records(tmp_path, "straggler")
    assert (named["rank"], named["host"], named["cause"]) == (SLOW_RANK, platform.node(), "compute")
    # Named once two windows in a row were slow: by the end of the second slow window, and no
    # earlier than the end of the first. On a loaded machine the window before the slowdown can
    # look slow too (a rank descheduled for a while), and then that one counts as the first; the
    # exact count of windows is tests/unit/test_stragglers.py's.
    first_slow_window_ends = FROM - 1 + LOG_EVERY
    assert first_slow_window_ends <= named["step"] <= first_slow_window_ends + LOG_EVERY, named
    # The healthy rank's own work stays the median; its wait shows on the train line.
    judged = [r for r in records(tmp_path, "train") if r["step"] - LOG_EVERY >= FROM - 1]
    assert all(r["compute_s_max"] > 1.5 * r["compute_s_p50"] for r in judged), judged
    assert all(r["allreduce_wait_s_mean"] >= 0.015 for r in judged), judged
