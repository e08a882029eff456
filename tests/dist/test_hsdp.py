"""train.strategy=hsdp for real on CPU (gloo) under torchrun: four ranks on a 2 x 2 mesh (shard
groups of two consecutive ranks, replicated twice) train the model four-rank DDP trains, up to
float summation order; a rank killed mid-save leaves the run to resume bit for bit; export writes
the weights it trained; and the checkpoint reshards into two-rank fsdp (tests/dist/test_fsdp.py
loads fsdp's into hsdp, and evaluates the result at one and three processes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from trainbox import config
from trainbox.checkpoint import shards
from trainbox.commands.export import export
from trainbox.config import factories
from trainbox.train.resume.state import params_sha256

from runs import QUICK, run_record, shared_run, summary, train

pytestmark = pytest.mark.slow

# Few steps of the built-in task, accumulating and clipping (the norm over a 2-D mesh), with
# checkpoints at steps 4 and 8. tests/launchers/test_fsdp_launchers.py's srun run shares it.
CONFIG = [*QUICK, "train.eval_every=0", "train.log_every=2", "train.ckpt_every=4",
          "train.grad_accum=2", "train.clip_grad_norm=0.5", "train.max_steps=8"]  # fmt: skip
HSDP = [*CONFIG, "train.strategy=hsdp", "train.shard_size=2"]
LAST = "checkpoints/step-00000008.dcp"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted four-rank hsdp run (the srun test's reference too)."""
    return shared_run(tmp_path_factory, *HSDP, nproc=4)


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["step"]: r["loss"] for r in records if r.get("kind") == "train"}


def test_hsdp_trains_on_its_mesh_and_checkpoints_whole(reference: Path) -> None:
    assert run_record(reference)["mesh"] == {"replicate": 2, "shard": 2}
    assert (summary(reference)["steps"], summary(reference)["world_size"]) == (8, 4)
    saved = [path.name for path in shards.existing(reference / "checkpoints")]
    assert saved == ["step-00000004.dcp", "step-00000008.dcp"]
    assert shards.check_alone(reference / LAST) is None


def test_hsdp_trains_the_model_ddp_trains(reference: Path, tmp_path: Path) -> None:
    # The same data split at four ranks; only the order of float sums differs.
    train(tmp_path, *CONFIG, "train.strategy=ddp", nproc=4)
    assert sorted(losses(reference)) == sorted(losses(tmp_path)) == [2, 4, 6, 8]
    assert losses(reference) == pytest.approx(losses(tmp_path), rel=1e-5)
    ddp = torch.load(tmp_path / "checkpoints" / "step-00000008.pt", weights_only=True)["model"]
    dcp_to_torch_save(reference / LAST, tmp_path / "hsdp.pt")
    hsdp = torch.load(tmp_path / "hsdp.pt", weights_only=True)["model"]
    assert hsdp.keys() == ddp.keys()
    for name in ddp:
        torch.testing.assert_close(hsdp[name], ddp[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_rank_killed_mid_save_leaves_the_rerun_bit_exact(reference: Path, tmp_path: Path) -> None:
    # SIGKILL of rank 3 once its shard of step 8 is written, before the manifest: the rerun
    # goes on from step 4 and ends where the uninterrupted run did.
    crashed = train(tmp_path, *HSDP, nproc=4, check=False,
                    env={"TRAINBOX_FAULT": "crash:point=write:step=8:rank=3"})  # fmt: skip
    assert crashed.returncode != 0
    assert [p.name for p in shards.existing(tmp_path / "checkpoints")] == ["step-00000004.dcp"]
    train(tmp_path, *HSDP, nproc=4)
    assert run_record(tmp_path)["resumed_from"].endswith("step-00000004.dcp")
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]


def test_the_checkpoint_resumes_as_fsdp_on_fewer_ranks(reference: Path, tmp_path: Path) -> None:
    # DCP reshards the 2 x 2 mesh's shards onto two ranks' one-dimensional mesh.
    resume = f"train.resume={reference / LAST}"
    train(tmp_path, *CONFIG, "train.strategy=fsdp", "train.max_steps=12", resume, nproc=2)
    record = run_record(tmp_path)
    assert record["mesh"] == {"replicate": 1, "shard": 2}
    assert record["resumed_from"].endswith("step-00000008.dcp")
    assert summary(tmp_path)["steps"] == 12
    assert sorted(losses(tmp_path)) == [10, 12]


def test_export_writes_the_weights_the_mesh_trained(reference: Path, tmp_path: Path) -> None:
    # In this process, with no process group, from the 2 x 2 mesh's shards.
    export(reference / LAST, tmp_path / "model.pt")
    settings = config.load(str(reference / "config.yaml"), [])
    model = factories.build_model(settings.model.factory, settings.model.args)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    assert params_sha256(model) == summary(reference)["params_sha256"]


def test_a_shard_size_that_does_not_fit_exits_2_before_writing_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    refused = train(run_dir, *HSDP, "train.shard_size=3", check=False)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "train.shard_size=3 is more than the world size of 1" in refused.stderr
    assert "HINT: " in refused.stderr
    assert not run_dir.exists()
