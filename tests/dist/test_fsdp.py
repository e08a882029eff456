"""train.strategy=fsdp for real: FSDP2 at two ranks trains as DDP does, a run whose rank is
killed mid-save resumes bit for bit, a checkpoint written by two ranks loads exactly into four
ranks' hsdp (a 2 x 2 mesh) and back at two, and eval and predict read it at any world size.

Every run is `torchrun --standalone -m trainbox run` with gloo on the built-in task.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from trainbox import config
from trainbox.checkpoint import shards
from trainbox.commands.export import export
from trainbox.config import factories
from trainbox.train.resume.state import params_sha256, tensors_sha256

from runs import QUICK, clean_env, shared_run, summary, train, trainbox_argv

pytestmark = pytest.mark.slow

# Two micro-batches and clipping, so both run under fsdp in every test here; 48 splits the 2,048
# validation samples into 43 batches, so at 2 and 4 ranks one rank has a batch fewer.
CONFIG = [*QUICK, "train.strategy=fsdp", "train.batch_size=48", "train.grad_accum=2",
          "train.clip_grad_norm=0.5"]  # fmt: skip
MIDDLE = "checkpoints/step-00000021.dcp"
LAST = "checkpoints/step-00000040.dcp"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted two-rank fsdp run that the others must reproduce."""
    return shared_run(tmp_path_factory, *CONFIG, nproc=2)


@pytest.fixture(scope="module")
def at_four(reference: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four ranks resumed from the two-rank checkpoint of step 21 as hsdp (two shard groups of
    two) and ended there at once, so their own checkpoint of step 21 is what they loaded."""
    middle = f"train.resume={reference / MIDDLE}"
    hsdp = ["train.strategy=hsdp", "train.shard_size=2"]
    return shared_run(tmp_path_factory, *CONFIG, *hsdp, middle, "train.max_steps=21", nproc=4)


@pytest.fixture(scope="module")
def evaluated(at_four: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """World size → `trainbox eval`'s JSON for the four-rank hsdp run's latest checkpoint."""
    out = tmp_path_factory.mktemp("eval")
    for n in (1, 3):
        trainbox(n, "eval", "--checkpoint", str(at_four), "--output", str(out / f"{n}.json"))
    return {n: json.loads((out / f"{n}.json").read_text()) for n in (1, 3)}


def trainbox(nproc: int, *args: str) -> None:
    """`trainbox ARGS` (under torchrun when nproc > 1), which must succeed."""
    proc = subprocess.run(trainbox_argv(nproc, *args), env=clean_env(), capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]


def full_state(checkpoint: Path, into: Path) -> dict[str, Any]:
    """A sharded checkpoint's whole model and optimizer state, put together by DCP."""
    dcp_to_torch_save(checkpoint, into)
    loaded: dict[str, Any] = torch.load(into, weights_only=True)
    return loaded


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(
            flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
        )
    return out


def test_fsdp_writes_a_whole_sharded_checkpoint_at_every_save(reference: Path) -> None:
    done = summary(reference)
    assert (done["steps"], done["world_size"]) == (40, 2)
    assert set(done["val_metrics"]) == {"val_loss", "val_accuracy", "val_samples"}
    folders = sorted(path.name for path in (reference / "checkpoints").glob("step-*"))
    assert folders == [f"step-{step:08d}.dcp" for step in (7, 14, 21, 28, 35, 40)]
    listed = json.loads((reference / MIDDLE / "manifest.json").read_text())["files"]
    assert set(listed) == {"__0_0.distcp", "__1_0.distcp", ".metadata", "record.pt"}
    assert os.readlink(reference / "checkpoints" / "latest") == "step-00000040.dcp"


def test_fsdp_trains_the_model_ddp_trains(reference: Path, tmp_path: Path) -> None:
    # Accumulation, clipping and the optimizer as DDP does them; only summation order differs.
    train(tmp_path, *CONFIG, "train.strategy=ddp", nproc=2)
    ddp = torch.load(tmp_path / "checkpoints" / "step-00000040.pt", weights_only=True)["model"]
    fsdp = full_state(reference / "checkpoints" / "step-00000040.dcp", tmp_path / "f.pt")["model"]
    assert fsdp.keys() == ddp.keys()
    for name in ddp:
        torch.testing.assert_close(fsdp[name], ddp[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_rank_killed_mid_save_leaves_no_checkpoint_and_the_rerun_is_bit_exact(
    reference: Path, tmp_path: Path
) -> None:
    # SIGKILL of rank 1 once its shards of step 14 are on disk, before the manifest: the run
    # dies, step 14 is only the hidden folder, and the rerun goes on from step 7.
    crashed = train(tmp_path, *CONFIG, nproc=2, check=False,
                    env={"TRAINBOX_FAULT": "crash:point=write:step=14:rank=1"})  # fmt: skip
    assert crashed.returncode != 0
    checkpoints = tmp_path / "checkpoints"
    assert [path.name for path in shards.existing(checkpoints)] == ["step-00000007.dcp"]
    assert (checkpoints / ".step-00000014.dcp.tmp" / "__1_0.distcp").is_file()
    train(tmp_path, *CONFIG, nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    assert not (checkpoints / ".step-00000014.dcp.tmp").exists()
    assert json.loads((tmp_path / "run.json").read_text())["resumed_from"].endswith(
        "step-00000007.dcp"
    )


def test_four_ranks_load_the_two_rank_checkpoint_exactly(
    reference: Path, at_four: Path, tmp_path: Path
) -> None:
    saved = flat(full_state(reference / MIDDLE, tmp_path / "two.pt"))
    loaded = flat(full_state(at_four / MIDDLE, tmp_path / "four.pt"))
    assert loaded.keys() == saved.keys()
    assert any(".exp_avg_sq" in key for key in saved)
    differ = [key for key in saved if not _same(saved[key], loaded[key])]
    assert differ == []
    assert len(json.loads((at_four / MIDDLE / "manifest.json").read_text())["files"]) == 6
    # The fingerprint of the loaded weights, gathered one tensor at a time across four ranks.
    model = full_state(reference / MIDDLE, tmp_path / "again.pt")["model"]
    assert summary(at_four)["params_sha256"] == tensors_sha256(model)


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, torch.Tensor):
        return isinstance(theirs, torch.Tensor) and torch.equal(ours, theirs)
    return bool(ours == theirs)


def test_back_at_two_ranks_the_run_ends_as_the_uninterrupted_one(
    reference: Path, at_four: Path, tmp_path: Path
) -> None:
    # The data position carries over; the built-in task draws no random numbers while training.
    train(tmp_path, *CONFIG, f"train.resume={at_four / MIDDLE}", nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    first_logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"]
    assert first_logged > 21


@pytest.mark.parametrize("world", [1, 3])
def test_eval_of_a_sharded_checkpoint_equals_the_trainers_own_evaluation(
    at_four: Path, evaluated: dict[int, Any], world: int
) -> None:
    # Read whole on every rank, the weights give the sharded model's validation to the last bit,
    # whichever mesh wrote them.
    result = evaluated[world]
    assert (result["step"], result["world_size"]) == (21, world)
    assert result["val_metrics"] == summary(at_four)["val_metrics"]
    assert result["checkpoint"].endswith(MIDDLE)
    # The folder's identity is its manifest's, which lists every file's SHA-256.
    manifest = at_four / MIDDLE / shards.MANIFEST
    assert result["checkpoint_sha256"] == shards.sha256(manifest)


def test_predict_writes_the_same_bytes_from_a_sharded_checkpoint_at_every_world_size(
    reference: Path, tmp_path: Path
) -> None:
    for n in (1, 2):
        trainbox(
            n, "predict", "--checkpoint", str(reference), "--output", str(tmp_path / f"{n}.csv")
        )
    one = (tmp_path / "1.csv").read_bytes()
    assert one.count(b"\n") == 2048 + 1  # every validation sample, and the header
    assert (tmp_path / "2.csv").read_bytes() == one


def test_export_writes_one_state_dict_that_loads_into_the_model_the_run_trained(
    reference: Path, tmp_path: Path
) -> None:
    # In this process, with no process group, from the two-rank shards (the command's own
    # function: its command line is tested on its own, without the cost of a start-up).
    export(reference / LAST, tmp_path / "model.pt")
    settings = config.load(str(reference / "config.yaml"), [])
    model = factories.build_model(settings.model.factory, settings.model.args)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    assert params_sha256(model) == summary(reference)["params_sha256"]
