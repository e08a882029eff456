"""What DDP promises holds under train.strategy=fsdp: a stop signal on one rank stops both at one
step with a whole sharded checkpoint and exit 143, and the reruns end bit for bit; a rank that
stalls mid-forward or dies is named by the other with exit 4; a slow rank is named a straggler.

Real two-rank runs of the built-in task: node mode (`trainbox run dist.procs_per_node=2`, so the
supervisor's exit code is the workers'), plain torchrun, and ranks started by hand.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import pytest
import torch

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


# -- fleet health: a straggler --------------------------------------------------------------

SLOW_RANK, FROM, LOG_EVERY = 1, 21, 20
TINY = ["train.strategy=fsdp", "model.args.hidden=16", "model.args.layers=1",
        "train.batch_size=16", "train.eval_every=0", "train.ckpt_every=0"]  # fmt: skip


def test_a_rank_slow_in_its_own_work_is_named_a_straggler(tmp_path: Path) -> None:
    # Under fsdp the healthy rank waits for the slow one in the all-gathers of forward and
    # backward, not in a gradient all-reduce at the end of backward: that wait is not its work.
    fault = f"slow:rank={SLOW_RANK}:ms=40:from={FROM}"
    train(tmp_path, *TINY, f"train.max_steps={FROM - 1 + 4 * LOG_EVERY}",
          f"train.log_every={LOG_EVERY}", nproc=2, env={"TRAINBOX_FAULT": fault})  # fmt: skip
    (named,) = records(tmp_path, "straggler")
    assert (named["rank"], named["host"], named["cause"]) == (SLOW_RANK, platform.node(), "compute")
    assert named["step"] <= FROM - 1 + 3 * LOG_EVERY
    # The healthy rank's own work stays the median; its wait shows on the train line.
    judged = [r for r in records(tmp_path, "train") if r["step"] > FROM]
    assert all(r["compute_s_max"] > 1.5 * r["compute_s_p50"] for r in judged), judged
    assert all(r["allreduce_wait_s_mean"] >= 0.015 for r in judged), judged
