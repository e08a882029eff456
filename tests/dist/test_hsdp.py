"""train.strategy=hsdp for real on CPU (gloo) under torchrun: four ranks on a 2 x 2 mesh (shard
groups of two consecutive ranks, replicated twice) train and checkpoint, and the same run_dir
then resumes as a two-rank fsdp run to its end, DCP resharding the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainbox.checkpoint import shards

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow

# Few steps of the built-in task: one checkpoint at step 4, where the resume starts.
CONFIG = [*QUICK, "train.eval_every=0", "train.log_every=2", "train.ckpt_every=4"]
HSDP = [*CONFIG, "train.max_steps=4", "train.strategy=hsdp", "train.shard_size=2"]
FSDP = [*CONFIG, "train.max_steps=8", "train.strategy=fsdp"]


def run_record(run_dir: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return loaded


def test_hsdp_trains_on_its_mesh_and_resumes_as_fsdp_on_fewer_ranks(tmp_path: Path) -> None:
    train(tmp_path, *HSDP, nproc=4)
    assert run_record(tmp_path)["mesh"] == {"replicate": 2, "shard": 2}
    assert summary(tmp_path)["steps"] == 4
    [saved] = shards.existing(tmp_path / "checkpoints")
    assert saved.name == "step-00000004.dcp"
    assert shards.check_alone(saved) is None
    # Each of the four ranks wrote its own share: two copies of every shard, kept once.
    assert shards.read_record(saved)["step"] == 4

    train(tmp_path, *FSDP, nproc=2)
    record = run_record(tmp_path)
    assert record["mesh"] == {"replicate": 1, "shard": 2}
    assert record["resumed_from"].endswith("step-00000004.dcp")
    assert summary(tmp_path)["steps"] == 8
    steps = [json.loads(line).get("step") for line in (tmp_path / "metrics.jsonl").open()]
    assert max(s for s in steps if s is not None) == 8
