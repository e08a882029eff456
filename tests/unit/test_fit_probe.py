"""The first-batch probe: targets that do not fit `train.loss`, and items that are not
(inputs, target) pairs, are one exit-2 line before anything trains (issue 19, items 8 and 9)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from trainbox.errors import UsageError
from trainbox.train.data import contract
from trainbox.train.data.contract import Datasets
from trainbox.train.steps.functions import loss_fn

B = 16


class Items(Dataset):
    """A dataset whose every item is `item`."""

    def __init__(self, item: Any) -> None:
        self.item = item

    def __len__(self) -> int:
        return B

    def __getitem__(self, index: int) -> Any:
        return self.item


def probe(kind: str, model: torch.nn.Module, train: Any) -> None:
    contract.check_fit(model, Datasets(train=train), loss=lambda out, t: loss_fn(kind, out, t))


def pairs(inputs: torch.Tensor, targets: torch.Tensor) -> TensorDataset:
    return TensorDataset(inputs, targets)


FITTING = [
    ("cross_entropy", torch.nn.Linear(2, 3), pairs(torch.zeros(B, 2), torch.zeros(B, dtype=torch.long))),
    ("mse", torch.nn.Linear(2, 1), pairs(torch.zeros(B, 2), torch.zeros(B))),
    ("mse", torch.nn.Linear(2, 1), pairs(torch.zeros(B, 2), torch.zeros(B, 1))),
    ("mse", torch.nn.Linear(2, 3), pairs(torch.zeros(B, 2), torch.zeros(B, 3))),
    ("mse", torch.nn.Linear(2, 1), pairs(torch.zeros(B, 2), torch.zeros(B, dtype=torch.long))),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "model", "train"), FITTING)
def test_targets_that_fit_the_loss_pass(kind: str, model: torch.nn.Module, train: Any) -> None:
    probe(kind, model, train)


MISFITS = [
    # Float targets of the logits' shape are soft labels to torch: it trains, to nonsense.
    ("cross_entropy", torch.nn.Linear(2, 3), pairs(torch.zeros(B, 2), torch.rand(B, 3)),
     "train.loss=cross_entropy needs integer class indices as targets, not float32 targets of shape (16, 3)"),
    ("cross_entropy", torch.nn.Linear(2, 1), pairs(torch.zeros(B, 2), torch.rand(B, 1)),
     "not float32 targets of shape (16, 1)"),
    ("cross_entropy", torch.nn.Linear(2, 3), pairs(torch.zeros(B, 2), torch.zeros(B, dtype=torch.bool)),
     "not bool targets"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "model", "train", "said"), MISFITS)
def test_targets_that_do_not_fit_the_loss_are_one_line(
    kind: str, model: torch.nn.Module, train: Any, said: str
) -> None:
    with pytest.raises(UsageError) as caught:
        probe(kind, model, train)
    assert said in caught.value.line()
    assert "\n" not in caught.value.line()


def test_mse_outputs_must_have_one_row_per_sample() -> None:
    # [B, 1] outputs against [1, B] targets reshape without complaint but pair wrong values.
    model = torch.nn.Linear(2, 1)
    with pytest.raises(UsageError, match=r"train.loss=mse needs one output per target"):
        loss_fn("mse", model(torch.zeros(B, 2)), torch.zeros(1, B))


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ({"x": torch.zeros(2), "y": torch.tensor(0)}, "items are dict"),
        ("a line of text", "items are str"),
        ((torch.zeros(2), torch.tensor(0), torch.tensor(1)), "items are a tuple of 3"),
        ((torch.zeros(2), "label"), "items are a tuple of (Tensor, str)"),
    ],
)
def test_items_that_are_not_input_target_pairs_are_one_line(item: Any, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        probe("cross_entropy", torch.nn.Linear(2, 3), Items(item))
    line = caught.value.line()
    assert said in line
    assert "(inputs, target) pairs of tensors" in line
    assert "HINT:" in line
    assert "\n" not in line
