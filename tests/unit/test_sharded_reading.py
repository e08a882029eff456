"""eval and predict read a sharded checkpoint whole into an unsharded model, in one process,
with or without a process group, and name what does not fit or is damaged.

A real gloo group of one (in-memory store) and real DCP files; tests/dist/test_fsdp.py reads a
two-rank checkpoint at other world sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict

from trainbox.checkpoint import schema, shards
from trainbox.checkpoint.schema import Payload
from trainbox.infer.model import load_weights, sharded_problem
from trainbox.tasks.mlp import mlp
from trainbox.train.fsdp import wrap
from trainbox.train.state import tensors_sha256

CPU = torch.device("cpu")


@pytest.fixture
def world_of_one() -> Iterator[None]:
    # An in-memory store: a real gloo group with no port and nothing left behind.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def saved(directory: Path) -> tuple[Path, str]:
    """A one-rank fsdp checkpoint of a small MLP after an AdamW step, and its params_sha256."""
    torch.manual_seed(0)
    model = mlp(in_features=3, out_features=2, hidden=5, layers=2)
    wrap(model, CPU, world_size=1, amp_dtype=None, units=None)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    tensors = dict(zip((shards.MODEL, "optimizer"), get_state_dict(model, optimizer), strict=True))
    record = Payload(step=1, model={}, optimizer={}, sharded=True).to_dict()
    path = shards.save(directory, 1, tensors, record=record, device=CPU)
    return path, tensors_sha256(model.state_dict())


def payload(path: Path) -> Payload:
    return schema.read_file(path, shards.read_record(path))


@pytest.mark.parametrize("group", [True, False], ids=["in-a-group", "no-group"])
def test_a_sharded_checkpoint_loads_whole_into_an_unsharded_model(
    world_of_one: None, tmp_path: Path, group: bool
) -> None:
    del world_of_one
    path, fingerprint = saved(tmp_path)
    if not group:
        dist.destroy_process_group()
    torch.manual_seed(1)  # other initial weights
    model = mlp(in_features=3, out_features=2, hidden=5, layers=2)
    load_weights(model, path, payload(path))
    assert tensors_sha256(model.state_dict()) == fingerprint


def test_its_layout_on_the_meta_device_has_every_shape_and_no_memory(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    path, _ = saved(tmp_path)
    layout = shards.model_layout(path, torch.device("meta"))
    model = mlp(in_features=3, out_features=2, hidden=5, layers=2)
    assert {key: value.shape for key, value in layout.items()} == {
        key: value.shape for key, value in model.state_dict().items()
    }
    assert {value.device.type for value in layout.values()} == {"meta"}


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: mlp(in_features=3, out_features=2, hidden=6, layers=2), "shapes differ: 0.weight"),
        (lambda: mlp(in_features=3, out_features=2, hidden=5, layers=3), "missing from the"),
        (lambda: mlp(in_features=3, out_features=2, hidden=5, layers=1), "not in the model: 4."),
    ],
    ids=["wider", "deeper", "shallower"],
)
def test_a_model_the_shards_do_not_fit_is_refused_naming_the_tensors(
    world_of_one: None, tmp_path: Path, build: Callable[[], torch.nn.Module], named: str
) -> None:
    del world_of_one
    path, _ = saved(tmp_path)
    with pytest.raises(RuntimeError, match=named):
        load_weights(build(), path, payload(path))


def test_a_damaged_shard_is_named_before_anything_loads(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    path, _ = saved(tmp_path)
    assert sharded_problem(path, path, readable=True) is None
    (path / "__0_0.distcp").write_bytes(b"torn")
    problem = sharded_problem(path, path, readable=True)
    assert problem is not None
    assert "__0_0.distcp does not match its checksum" in problem.text
    assert "older checkpoint" in problem.hint


def test_a_checkpoint_file_is_not_checked_as_shards(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    (tmp_path / "step-00000001.pt").write_bytes(b"not read here")
    assert sharded_problem(tmp_path, tmp_path / "step-00000001.pt", readable=True) is None
