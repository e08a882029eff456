"""Sharded evaluation gives exact whole-set metrics (a world of one here; tests/dist has more)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from trainbox.train.evaluate import evaluate


@pytest.fixture
def world_of_one() -> Iterator[None]:
    # An in-memory store: a real gloo group with no port and nothing left behind.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_accuracy_and_loss_over_uneven_batches(world_of_one: None) -> None:
    del world_of_one
    inputs = torch.eye(3).repeat(3, 1)[:7]  # 7 samples, last batch of 3 is short
    targets = torch.tensor([0, 1, 2, 0, 1, 0, 0])
    model = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3) * 5)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=4)
    got = evaluate(
        model,
        loader,
        kind="cross_entropy",
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext(),
    )
    expected_loss = torch.nn.functional.cross_entropy(model(inputs), targets).item()
    assert got["val_samples"] == 7
    assert got["val_accuracy"] == pytest.approx(6 / 7)  # only sample 5 (class 2 vs 0) is wrong
    assert got["val_loss"] == pytest.approx(expected_loss)


def test_mae_for_regression(world_of_one: None) -> None:
    del world_of_one
    model = torch.nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(0.5)
    loader = DataLoader(TensorDataset(torch.zeros(5, 1), torch.zeros(5)), batch_size=2)
    got = evaluate(
        model, loader, kind="mse", device=torch.device("cpu"), autocast=contextlib.nullcontext()
    )
    assert (got["val_mae"], got["val_loss"], got["val_samples"]) == (
        pytest.approx(0.5),
        pytest.approx(0.25),
        5,
    )
