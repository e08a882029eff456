"""fsdp's state-side keys for real, at two ranks under torchrun: background sharded saves with
a user's state object, killed mid-save and resumed bit for bit, and init_from starting a new
fsdp run from a DDP run's one-file checkpoint and from an fsdp run's sharded one, exactly.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from trainbox.checkpoint import shards

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow

USER = "fsdp_user"
# Checkpoints at 7, 14 and 21: the background save of 14 is the one cut short.
CONFIG = [*QUICK, "train.max_steps=21", "train.eval_every=0", "train.strategy=fsdp",
          "train.async_save=true", f"train.state_factory={USER}:ema"]  # fmt: skip
LAST = "checkpoints/step-00000021.dcp"


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment that puts the user's package on PYTHONPATH (beside trainbox's own)."""
    root = tmp_path_factory.mktemp("pkg")
    shutil.copy(Path(__file__).with_name(f"{USER}.py"), root / f"{USER}.py")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, package: dict[str, str]) -> Path:
    """One uninterrupted two-rank fsdp run, saving in the background, with a user's EMA."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(run_dir, *CONFIG, nproc=2, env=package)
    return run_dir


def record(run_dir: Path) -> dict[str, object]:
    loaded: dict[str, object] = shards.read_record(run_dir / LAST)
    return loaded


def test_background_saves_are_whole_checkpoints_holding_the_users_state(
    reference: Path,
) -> None:
    assert [path.name for path in shards.existing(reference / "checkpoints")] == [
        "step-00000007.dcp", "step-00000014.dcp", "step-00000021.dcp"]  # fmt: skip
    for path in shards.existing(reference / "checkpoints"):
        assert shards.check_alone(path) is None
    ema = record(reference)["extra_state"]["ema"]  # type: ignore[index]
    assert ema["updates"] == 21
    # The shadow is the whole model's, not rank 0's shard of it.
    shapes = {k: tuple(v.shape) for k, v in shards.whole_model(reference / LAST).items()}
    assert {k: tuple(v.shape) for k, v in ema["shadow"].items()} == shapes


def test_a_rank_killed_mid_background_save_resumes_bit_exactly_with_its_state(
    reference: Path, package: dict[str, str], tmp_path: Path
) -> None:
    # SIGKILL of rank 1 on its writer thread once its shards of step 14 are on disk, while
    # training has moved on: step 14 never counts, and the rerun goes on from step 7.
    fault = {**package, "TRAINBOX_FAULT": "crash:point=write:step=14:rank=1"}
    crashed = train(tmp_path, *CONFIG, nproc=2, check=False, env=fault)
    assert crashed.returncode != 0
    checkpoints = tmp_path / "checkpoints"
    assert [path.name for path in shards.existing(checkpoints)] == ["step-00000007.dcp"]
    assert (checkpoints / ".step-00000014.dcp.tmp" / "__1_0.distcp").is_file()
    train(tmp_path, *CONFIG, nproc=2, env=package)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    resumed = json.loads((tmp_path / "run.json").read_text())["resumed_from"]
    assert resumed.endswith("step-00000007.dcp")
    ours, theirs = record(tmp_path)["extra_state"], record(reference)["extra_state"]
    assert ours["ema"]["updates"] == theirs["ema"]["updates"] == 21  # type: ignore[index]
    for name, value in theirs["ema"]["shadow"].items():  # type: ignore[index]
        assert torch.equal(ours["ema"]["shadow"][name], value), name  # type: ignore[index]


# lr 0: the weights stay what init_from loaded, so the run's params_sha256 shows them.
FROZEN = ["train.max_steps=2", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
          "optim.lr=0", "optim.warmup_steps=0"]  # fmt: skip


def test_init_from_an_fsdp_runs_sharded_checkpoint_loads_its_weights_exactly(
    reference: Path, tmp_path: Path
) -> None:
    train(tmp_path, *FROZEN, "train.strategy=fsdp", f"train.init_from={reference}", nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["initialised_from"] == str(reference / LAST)


def test_init_from_a_ddp_runs_checkpoint_loads_its_weights_exactly(tmp_path: Path) -> None:
    source = tmp_path / "ddp"
    train(source, "train.max_steps=3", "train.ckpt_every=0", "train.eval_every=0")
    train(tmp_path / "fsdp", *FROZEN, "train.strategy=fsdp", f"train.init_from={source}",
          nproc=2)  # fmt: skip
    assert summary(tmp_path / "fsdp")["params_sha256"] == summary(source)["params_sha256"]
    run = json.loads((tmp_path / "fsdp" / "run.json").read_text())
    assert run["initialised_from"] == str(source / "checkpoints" / "step-00000003.pt")
