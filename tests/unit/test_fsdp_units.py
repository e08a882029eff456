"""Which modules fsdp shards as units (the default repeated blocks, train.fsdp_units' checks),
and how they are wrapped: one FSDP unit each and the root, precision from train.amp."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from trainbox.errors import UsageError
from trainbox.tasks.mlp import mlp
from trainbox.train.parallel.fsdp import (
    checked_units,
    chosen_units,
    mixed_precision,
    repeated_blocks,
    wrap,
)
from trainbox.train.steps.user_code import UserFn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.mlp = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([Block(), Block(), Block()])
        self.head = nn.Linear(4, 10)


def names(model: nn.Module, units: list[nn.Module]) -> list[str]:
    found = {id(module): name for name, module in model.named_modules()}
    return [found[id(unit)] for unit in units]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # Linear layers between activations: the layers with parameters repeat.
        (mlp(in_features=2, out_features=3, hidden=8, layers=2), ["0", "2", "4"]),
        # A decoder's blocks, not the Linear pairs repeated inside each block.
        (Decoder(), ["layers.0", "layers.1", "layers.2"]),
        # Two classes among the parameter holders: nothing repeats.
        (nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)), []),
        # One block is not a repetition.
        (nn.Sequential(nn.Linear(2, 2), nn.ReLU()), []),
        (nn.Linear(2, 2), []),
    ],
)
def test_the_default_units_are_the_repeated_blocks(model: nn.Module, expected: list[str]) -> None:
    assert names(model, repeated_blocks(model)) == expected


def test_a_users_units_are_taken_as_given_without_the_root() -> None:
    model = Decoder()
    picked = UserFn(fn=lambda m: [m.head, m.layers[1], m], name="mine:units")
    assert names(model, chosen_units(model, picked)) == ["head", "layers.1"]


def test_every_problem_with_a_users_units_is_named_at_once() -> None:
    model = Decoder()
    stranger = nn.Linear(2, 2)
    with pytest.raises(UsageError) as caught:
        checked_units(model, ["layers", stranger, model.head, model.head], name="mine:units")
    assert caught.value.problems == [
        "train.fsdp_units mine:units: item 0 is str, not a torch.nn.Module",
        "train.fsdp_units mine:units: item 1 (Linear) is not part of the model",
        "train.fsdp_units mine:units: a module is listed twice",
    ]
    assert "distinct submodules" in caught.value.hint


def test_units_that_are_not_a_list_are_refused() -> None:
    model = Decoder()
    with pytest.raises(UsageError, match=r"mine:units returned Linear, not a list"):
        chosen_units(model, UserFn(fn=lambda m: m.head, name="mine:units"))


def test_a_units_function_with_the_wrong_signature_is_refused() -> None:
    with pytest.raises(UsageError, match=r"train.fsdp_units mine:units does not accept"):
        chosen_units(Decoder(), UserFn(fn=lambda: [], name="mine:units"))


@pytest.mark.parametrize(("amp", "gathered"), [(torch.bfloat16, torch.bfloat16), (None, None)])
def test_parameters_follow_train_amp_and_gradients_reduce_in_fp32(
    amp: torch.dtype | None, gathered: torch.dtype | None
) -> None:
    policy = mixed_precision(amp)
    assert (policy.param_dtype, policy.reduce_dtype) == (gathered, torch.float32)


@pytest.fixture
def world_of_one() -> Iterator[None]:
    # An in-memory store: a real gloo group with no port and nothing left behind.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_wrapping_shards_each_unit_and_the_root(world_of_one: None) -> None:
    del world_of_one
    model = Decoder()
    wrapped = wrap(model, torch.device("cpu"), world_size=1, amp_dtype=None, units=None)
    sharded = [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
    assert wrapped is model
    assert sharded == ["", "layers.0", "layers.1", "layers.2"]
    assert all(isinstance(param, DTensor) for param in model.parameters())
