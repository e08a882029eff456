"""What is done to each block besides sharding it: activation checkpointing (recompute in
backward, the same numbers bit for bit), compiling each fsdp unit's forward, and fsdp's
reshard-after-forward switch; under ddp, checkpointing covers the repeated blocks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tinyloop import world_of_one as one_rank
from trainbox import config
from trainbox.train.parallel import blocks, ddp, fsdp


class Counted(nn.Module):
    """A block that counts how often its forward runs (forward and recompute alike)."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.linear, self.drop = nn.Linear(width, width), nn.Dropout(0.3)
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return x + self.drop(torch.tanh(self.linear(x)))


class Net(nn.Module):
    """An input layer, three repeated blocks (with dropout), a head: the root holds parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.head = nn.Linear(3, 6), nn.Linear(6, 2)
        self.layers = nn.ModuleList([Counted(), Counted(), Counted()])
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture
def world_of_one() -> Iterator[None]:
    with one_rank():
        yield


def trained(model: nn.Module, forward: Callable[[torch.Tensor], Any], steps: int = 3) -> None:
    """`steps` AdamW steps on fixed random batches, dropout drawing from a fixed seed."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1)
    torch.manual_seed(2)
    for _ in range(steps):
        x, y = torch.randn(8, 3, generator=data), torch.randint(0, 2, (8,), generator=data)
        nn.functional.cross_entropy(forward(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def full(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()
        for name, value in model.state_dict().items()
    }


def assert_bit_identical(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    assert all(torch.equal(left[name], right[name]) for name in left), "parameters differ"


def built() -> Net:
    torch.manual_seed(0)
    return Net()


def test_recomputing_a_block_changes_no_bit_and_runs_its_forward_again() -> None:
    plain, checkpointed = built(), built()
    for layer in checkpointed.layers:
        blocks.recompute_in_backward(layer)
    trained(plain, plain)
    trained(checkpointed, checkpointed)
    assert_bit_identical(full(plain), full(checkpointed))
    # Dropout draws the same mask on recompute: the RNG state is replayed.
    assert [layer.runs for layer in plain.layers] == [3, 3, 3]
    assert [layer.runs for layer in checkpointed.layers] == [6, 6, 6]


def test_evaluation_does_not_recompute() -> None:
    model = built()
    blocks.recompute_in_backward(model.layers[0])
    with torch.no_grad():
        model(torch.randn(2, 3))
    assert model.layers[0].runs == 1


def test_fsdp_checkpoints_each_unit_and_keeps_the_parameters_bit_for_bit(
    world_of_one: None,
) -> None:
    del world_of_one
    results = []
    for checkpointing in (False, True):
        model = built()
        options = fsdp.UnitOptions(checkpointing=checkpointing)
        fsdp.wrap(model, torch.device("cpu"), world_size=1, amp_dtype=None, units=None,
                  options=options)  # fmt: skip
        trained(model, model)
        results.append(full(model))
        # Each unit ran again in backward; the root, which holds the others, did not.
        assert [layer.runs for layer in model.layers] == [3 * (1 + checkpointing)] * 3
        assert model.runs == 3
    assert_bit_identical(*results)


@pytest.mark.parametrize(
    ("model", "recomputed"),
    [
        (built, ["layers.0", "layers.1", "layers.2"]),
        # No repeated block: the whole model is the one block.
        (lambda: nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), [""]),
    ],
    ids=["repeated-blocks", "one-block"],
)
def test_ddp_checkpoints_the_repeated_blocks(
    world_of_one: None, model: Callable[[], nn.Module], recomputed: list[str]
) -> None:
    del world_of_one
    train = config.load(None, ["train.activation_checkpointing=true"]).train
    module = model()
    before = {name: sub.forward for name, sub in module.named_modules()}
    wrapper, forward = ddp.wrap(module, torch.device("cpu"), train)
    changed = [name for name, sub in module.named_modules() if sub.forward != before[name]]
    assert changed == recomputed
    assert forward is wrapper


def test_ddp_with_checkpointing_trains_as_without(world_of_one: None) -> None:
    del world_of_one
    results = []
    for setting in ("false", "true"):
        train = config.load(None, [f"train.activation_checkpointing={setting}"]).train
        model = built()
        _, forward = ddp.wrap(model, torch.device("cpu"), train)
        trained(model, forward)
        results.append(full(model))
    assert_bit_identical(*results)


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The functions torch.compile is given (and handed back as they are, uncompiled)."""
    given: list[object] = []

    def record(fn: object, **options: object) -> object:
        del options
        given.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", record)
    return given


@pytest.mark.parametrize(
    ("model", "units"),
    [
        (built, ["layers.0", "layers.1", "layers.2"]),
        (lambda: nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), [""]),
    ],
    ids=["each-unit", "the-root-alone"],
)
def test_fsdp_compiles_each_units_forward(
    world_of_one: None,
    compiled: list[object],
    model: Callable[[], nn.Module],
    units: list[str],
) -> None:
    del world_of_one
    module = model()
    names = {id(sub): name for name, sub in module.named_modules()}
    fsdp.wrap(module, torch.device("cpu"), world_size=1, amp_dtype=None, units=None,
              options=fsdp.UnitOptions(compiled=True))  # fmt: skip
    # Bound forwards only: the module's call, where FSDP's hooks run, stays eager.
    assert [names[id(getattr(fn, "__self__", None))] for fn in compiled] == units


@pytest.mark.parametrize("reshard", [True, False])
def test_units_keep_their_gathered_parameters_after_forward_only_when_asked(
    world_of_one: None, reshard: bool
) -> None:
    del world_of_one
    model = built()
    fsdp.wrap(model, torch.device("cpu"), world_size=1, amp_dtype=None, units=None,
              options=fsdp.UnitOptions(reshard_after_forward=reshard))  # fmt: skip
    model(torch.randn(2, 3))
    unit_sharded = {isinstance(p, DTensor) for p in model.layers.parameters()}
    root_sharded = {isinstance(p, DTensor) for p in model.head.parameters()}
    assert unit_sharded == {reshard}
    assert root_sharded == {False}  # the root is kept for backward, as FSDP advises
    assert dist.is_initialized()
