"""train.strategy=hsdp for real on CPU (gloo) under torchrun: four ranks on a 2 x 2 mesh (shard
groups of two consecutive ranks, replicated twice) train the losses four-rank fsdp trains, up to
float summation order, and checkpoint; the same run_dir then resumes as a two-rank fsdp run to its
end, DCP resharding the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainbox.checkpoint import shards

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow

# Few steps of the built-in task, accumulating and clipping (the norm over a 2-D mesh): one
# checkpoint at step 4, where the resume starts.
CONFIG = [*QUICK, "train.eval_every=0", "train.log_every=2", "train.ckpt_every=4",
          "train.grad_accum=2", "train.clip_grad_norm=0.5"]  # fmt: skip
HSDP = [*CONFIG, "train.max_steps=4", "train.strategy=hsdp", "train.shard_size=2"]
FSDP = [*CONFIG, "train.max_steps=8", "train.strategy=fsdp"]
# The same first four steps under fsdp at four ranks: the same data split, one 1-D mesh.
FSDP_4 = [*CONFIG, "train.max_steps=4", "train.strategy=fsdp"]


def run_record(run_dir: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return loaded


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["step"]: r["loss"] for r in records if r.get("kind") == "train"}


def test_hsdp_trains_on_its_mesh_and_resumes_as_fsdp_on_fewer_ranks(tmp_path: Path) -> None:
    hsdp, fsdp = tmp_path / "hsdp", tmp_path / "fsdp"
    train(hsdp, *HSDP, nproc=4)
    assert run_record(hsdp)["mesh"] == {"replicate": 2, "shard": 2}
    assert summary(hsdp)["steps"] == 4
    [saved] = shards.existing(hsdp / "checkpoints")
    assert saved.name == "step-00000004.dcp"
    assert shards.check_alone(saved) is None
    assert shards.read_record(saved)["step"] == 4

    train(fsdp, *FSDP_4, nproc=4)
    assert run_record(fsdp)["mesh"] == {"replicate": 1, "shard": 4}
    theirs = losses(fsdp)
    assert sorted(losses(hsdp)) == sorted(theirs) == [2, 4]
    assert losses(hsdp) == pytest.approx(theirs, rel=1e-5)

    train(hsdp, *FSDP, nproc=2)
    record = run_record(hsdp)
    assert record["mesh"] == {"replicate": 1, "shard": 2}
    assert record["resumed_from"].endswith("step-00000004.dcp")
    assert summary(hsdp)["steps"] == 8
    assert sorted(losses(hsdp)) == [2, 4, 6, 8]


def test_a_shard_size_that_does_not_fit_exits_2_before_writing_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    refused = train(run_dir, *HSDP, "train.shard_size=3", check=False)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "train.shard_size=3 is more than the world size of 1" in refused.stderr
    assert "HINT: " in refused.stderr
    assert not run_dir.exists()
