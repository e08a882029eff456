"""Sharded checkpoints at one rank: complete or absent, checked file by file, pruned whole, and
found on resume as the one-file checkpoints are.

A real gloo group of one (in-memory store) and real DCP files; the runs in
tests/dist/test_fsdp.py cover several ranks and other world sizes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainbox import config
from trainbox.checkpoint import files, schema, shards
from trainbox.checkpoint.schema import Payload
from trainbox.config import Config
from trainbox.errors import StorageError, UsageError
from trainbox.tasks.mlp import mlp
from trainbox.train.parallel.fsdp import wrap
from trainbox.train.resume.start import find, find_shards
from trainbox.train.resume.state import TrainState, tensors_sha256
from trainbox.train.steps.user_code import choose

CPU = torch.device("cpu")


@pytest.fixture
def world_of_one() -> Iterator[None]:
    # An in-memory store: a real gloo group with no port and nothing left behind.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def save(directory: Path, step: int) -> Path:
    tensors = {"model": {"w": torch.arange(6.0).reshape(2, 3) + step}}
    record = Payload(step=step, model={}, optimizer={}, sharded=True).to_dict()
    return shards.save(directory, step, tensors, record=record, device=CPU)


def test_a_saved_checkpoint_is_whole_listed_and_latest(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    path = save(tmp_path, 3)
    assert path == tmp_path / "step-00000003.dcp"
    listed = json.loads((path / shards.MANIFEST).read_text())["files"]
    assert set(listed) == {"__0_0.distcp", ".metadata", shards.RECORD}
    assert shards.check(path, rank=0, world_size=1) is None
    assert files.latest_name(tmp_path) == path.name
    assert not list(tmp_path.glob(".*.tmp"))


def test_its_record_reads_back_as_a_sharded_payload(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    path = save(tmp_path, 3)
    payload = schema.read_file(path, shards.read_record(path))
    assert (payload.step, payload.sharded, dict(payload.model)) == (3, True, {})


def test_the_tensors_load_back_exactly(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    path = save(tmp_path, 3)
    into = {"model": {"w": torch.zeros(2, 3)}}
    shards.load_tensors(path, into)
    assert torch.equal(into["model"]["w"], torch.arange(6.0).reshape(2, 3) + 3)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / "__0_0.distcp").write_bytes(b"torn"), "__0_0.distcp does not match"),
        (lambda p: (p / shards.RECORD).unlink(), "record.pt cannot be read"),
        (lambda p: (p / shards.MANIFEST).unlink(), "has no readable manifest.json"),
        (lambda p: (p / shards.MANIFEST).write_text("{}"), "does not list the checkpoint's"),
        (lambda p: (p / shards.MANIFEST).write_text("[1]"), "does not list the checkpoint's"),
    ],
)
def test_a_damaged_checkpoint_is_named_with_its_file(
    world_of_one: None, tmp_path: Path, damage: object, reason: str
) -> None:
    del world_of_one
    path = save(tmp_path, 3)
    damage(path)  # type: ignore[operator]
    found = shards.check(path, rank=0, world_size=1)
    assert found is not None
    assert reason in found


def test_pruning_keeps_the_newest_and_removes_leftovers(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    for step in (1, 2, 3):
        save(tmp_path, step)
    (tmp_path / ".step-00000004.dcp.tmp").mkdir()  # a save killed part way
    shards.prune(tmp_path, keep_last=2)
    assert [path.name for path in shards.existing(tmp_path)] == [
        "step-00000002.dcp",
        "step-00000003.dcp",
    ]
    assert not (tmp_path / ".step-00000004.dcp.tmp").exists()


def fsdp_config(resume: str = "auto") -> Config:
    return config.load(None, ["train.strategy=fsdp", f"train.resume={resume}"])


def test_resuming_skips_a_damaged_newest_checkpoint_for_the_one_before(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    save(tmp_path, 1)
    newest = save(tmp_path, 2)
    (newest / "__0_0.distcp").write_bytes(b"torn")
    search = find_shards(fsdp_config(), tmp_path, rank=0, world_size=1)
    assert search.problem is None
    assert search.found is not None
    assert (search.found.path.name, search.found.payload.step) == ("step-00000001.dcp", 1)
    assert search.damaged == [newest]


def test_every_checkpoint_damaged_is_refused(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    (save(tmp_path, 1) / shards.RECORD).write_bytes(b"torn")
    search = find_shards(fsdp_config(), tmp_path, rank=0, world_size=1)
    assert search.found is None
    assert search.problem is not None
    assert "every checkpoint in" in search.problem.text
    assert "record.pt does not match its checksum" in search.problem.text


def test_a_named_sharded_checkpoint_is_resumed(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    path = save(tmp_path / "other", 5)
    search = find_shards(fsdp_config(str(path)), tmp_path / "mine", rank=0, world_size=1)
    assert search.problem is None
    assert search.found is not None
    assert search.found.payload.step == 5


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_run_refuses_the_other_strategys_checkpoints(
    world_of_one: None, tmp_path: Path, strategy: str
) -> None:
    del world_of_one
    if strategy == "fsdp":
        (tmp_path / "step-00000003.pt").write_bytes(b"a ddp checkpoint")
        search = find_shards(fsdp_config(), tmp_path, rank=0, world_size=1)
    else:
        save(tmp_path, 3)
        search = find(config.load(None, []), tmp_path)
    assert search.problem is not None
    assert search.problem.text.startswith(f"train.strategy={strategy} but {tmp_path} holds")
    assert "the train.strategy the run was started with" in search.problem.hint


def test_resume_never_refuses_a_whole_checkpoint_but_passes_damaged_ones(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    whole = find_shards(
        fsdp_config("never"), (save(tmp_path / "a", 1)).parent, rank=0, world_size=1
    )
    assert whole.problem is not None
    assert "train.resume=never but" in whole.problem.text
    torn = save(tmp_path / "b", 1)
    (torn / "__0_0.distcp").write_bytes(b"torn")
    damaged = find_shards(fsdp_config("never"), torn.parent, rank=0, world_size=1)
    assert (damaged.problem, damaged.found, damaged.damaged) == (None, None, [torn])


def sharded_state(hidden: int) -> TrainState:
    """A one-rank fsdp TrainState of a two-layer MLP after one optimizer step."""
    settings = fsdp_config()
    model = mlp(in_features=2, out_features=2, hidden=hidden, layers=1)
    wrap(model, CPU, world_size=1, amp_dtype=None, units=None)
    state = TrainState(settings, model, user_code=choose(settings), world_size=1, device=CPU,
                       amp_dtype=None)  # fmt: skip
    model(torch.ones(4, 2)).sum().backward()
    state.optimizer.step()
    state.scheduler.step()
    state.step = 1
    return state


def whole(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if isinstance(value, DTensor) else value


def save_state(state: TrainState, directory: Path) -> Path:
    record = state.payload(config={}, config_hash="", rng=[], sharded=True).to_dict()
    return shards.save(directory, 1, state.sharded_tensors(), record=record, device=CPU)


def test_a_fresh_state_restores_the_saved_weights_and_optimizer_exactly(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    torch.manual_seed(0)
    saved = sharded_state(hidden=4)
    path = save_state(saved, tmp_path)
    torch.manual_seed(1)  # other initial weights
    fresh = sharded_state(hidden=4)
    payload = schema.read_file(path, shards.read_record(path))
    fresh.restore(payload, source=str(path), changed=[], rank=0, world_size=1)
    ours, theirs = fresh.sharded_tensors(), saved.sharded_tensors()
    assert tensors_sha256(ours["model"]) == tensors_sha256(theirs["model"])
    for name, moments in theirs["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(whole(ours["optimizer"]["state"][name][key]), whole(value))
    assert fresh.scheduler.state_dict() == saved.scheduler.state_dict()


def test_shards_of_another_model_are_refused_naming_the_checkpoint(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    path = save_state(sharded_state(hidden=4), tmp_path)
    wider = sharded_state(hidden=6)
    payload = schema.read_file(path, shards.read_record(path))
    with pytest.raises(UsageError) as caught:
        wider.restore(payload, source=str(path), changed=[], rank=0, world_size=1)
    assert caught.value.problems[0].startswith(f"{path} does not fit this run's model")
    assert "new run_dir" in caught.value.hint


def test_a_save_that_cannot_start_is_a_storage_error_and_keeps_the_older_ones(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    kept = save(tmp_path, 1)
    (tmp_path / ".step-00000002.dcp.tmp").write_text("a file where the save's folder goes")
    with pytest.raises(StorageError, match=r"could not start checkpoint .*step-00000002\.dcp"):
        save(tmp_path, 2)
    assert shards.existing(tmp_path) == [kept]
    assert shards.check(kept, rank=0, world_size=1) is None
