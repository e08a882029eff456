"""Which modules fsdp shards as units: the default (repeated blocks) and train.fsdp_units' checks."""

from __future__ import annotations

import pytest
from torch import nn

from trainbox.errors import UsageError
from trainbox.tasks.mlp import mlp
from trainbox.train.fsdp import chosen_units, repeated_blocks, unit_problems
from trainbox.train.user_code import UserFn


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
        unit_problems(model, ["layers", stranger, model.head, model.head], name="mine:units")
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
