"""Batches of any nesting: moved to the device leaf by leaf, counted by their first tensor."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch

from trainbox.errors import UsageError
from trainbox.train.data.batches import leaves, on_device, sample_count, to_device


class Pair(NamedTuple):
    inputs: torch.Tensor
    target: torch.Tensor


@dataclass(frozen=True)
class Clip:
    frames: torch.Tensor
    label: torch.Tensor
    source: str = "synthetic"


def rows(n: int, *shape: int) -> torch.Tensor:
    return torch.zeros(n, *shape)


BATCHES = [
    ("tensor", rows(4, 2)),
    ("tuple", (rows(4, 2), rows(4))),
    ("list", [rows(4, 2), rows(4)]),
    ("dict", {"tokens": rows(4, 7), "numeric": rows(4, 3), "label": rows(4)}),
    ("namedtuple", Pair(rows(4, 2), rows(4))),
    ("dataclass", Clip(rows(4, 8, 3, 16, 16), rows(4))),
    ("nested", {"x": (rows(4, 2), [rows(4, 1)]), "meta": {"ids": rows(4)}, "name": "b"}),
    ("per-batch scalar", {"x": rows(4, 2), "weight": torch.tensor(0.5), "step": 3}),
    ("tuple with a 0-d value", (rows(4, 2), torch.tensor(0.5), rows(4))),
    ("list with a number", [rows(4, 2), 3, rows(4)]),
]


@pytest.mark.parametrize("batch", [b for _, b in BATCHES], ids=[i for i, _ in BATCHES])
def test_sample_count_is_the_first_tensors_leading_dimension(batch: Any) -> None:
    assert sample_count(batch) == 4


@pytest.mark.parametrize("batch", [b for _, b in BATCHES], ids=[i for i, _ in BATCHES])
def test_to_device_keeps_the_structure_and_moves_every_tensor(batch: Any) -> None:
    moved = to_device(batch, torch.device("meta"))
    assert type(moved) is type(batch)
    assert [path for path, _ in leaves(moved)] == [path for path, _ in leaves(batch)]
    assert all(leaf.device.type == "meta" for _, leaf in leaves(moved))


def test_non_tensor_leaves_pass_through() -> None:
    moved = to_device({"x": rows(2), "name": "b", "ids": [1, 2]}, torch.device("meta"))
    assert moved["name"] == "b"
    assert moved["ids"] == [1, 2]
    assert to_device(Clip(rows(2), rows(2), source="disk"), torch.device("meta")).source == "disk"


def test_an_ordered_dict_stays_one() -> None:
    assert type(to_device(OrderedDict(x=rows(2)), torch.device("meta"))) is OrderedDict


@pytest.mark.parametrize(
    ("batch", "named"),
    [
        ({"tokens": rows(4, 7), "label": rows(3)}, "batch['tokens'] has 4, batch['label'] has 3"),
        ((rows(4), rows(5), rows(4), rows(2)), "batch[0] has 4, batch[1] has 5, batch[3] has 2"),
        ([torch.tensor(1.0), rows(4), rows(2)], "batch[1] has 4, batch[2] has 2"),
        (Clip(rows(4), rows(6)), "batch.frames has 4, batch.label has 6"),
    ],
)
def test_tensors_that_disagree_are_named(batch: Any, named: str) -> None:
    with pytest.raises(UsageError, match="disagree on the number of samples") as caught:
        sample_count(batch)
    assert named in caught.value.line()


@pytest.mark.parametrize(
    "batch", [{"name": "x"}, (), [3, 4], torch.tensor(1.0), (torch.tensor(1.0), torch.tensor(2))]
)
def test_a_batch_without_a_sized_tensor_is_an_error(batch: Any) -> None:
    with pytest.raises(UsageError, match="holds no tensor with a sample dimension"):
        sample_count(batch)


@pytest.mark.parametrize("batch", [b for _, b in BATCHES], ids=[i for i, _ in BATCHES])
def test_on_device_is_to_device_and_sample_count_in_one_call(batch: Any) -> None:
    moved, count = on_device(batch, torch.device("meta"))
    assert count == 4
    assert type(moved) is type(batch)
    assert [path for path, _ in leaves(moved)] == [path for path, _ in leaves(batch)]
    assert all(leaf.device.type == "meta" for _, leaf in leaves(moved))


def test_on_device_names_the_tensors_that_disagree() -> None:
    with pytest.raises(UsageError, match="batch\\[0\\] has 4, batch\\[1\\] has 3"):
        on_device((rows(4), rows(3)), torch.device("meta"))
