"""Sharded evaluation gives exact whole-set metrics (a world of one here; tests/dist has more)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from trainbox.errors import UsageError
from trainbox.train.evaluate import eval_step, evaluate, step_of


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
        step=eval_step("", kind="cross_entropy"),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext(),
        slots=8,
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
        model,
        loader,
        step=eval_step("", kind="mse"),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext(),
        slots=8,
    )
    assert (got["val_mae"], got["val_loss"], got["val_samples"]) == (
        pytest.approx(0.5),
        pytest.approx(0.25),
        5,
    )


class Pixels(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Dict samples: a 2x2 `image` and its `mask`, as a segmentation task's loader yields them."""

    def __init__(self, size: int) -> None:
        self.images = torch.arange(size * 4, dtype=torch.float32).reshape(size, 2, 2) / 10

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[index], "mask": torch.ones(2, 2)}


def pixel_error(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, tuple]:
    # A mean over pixels, not samples: its count is the pixels; "hits" counts per sample.
    error = (model(batch["image"]) - batch["mask"]).abs()
    hits = (error.flatten(1).mean(dim=1) < 1).sum()
    return {"pixel_error": (error.sum(), error.numel()), "hits": (hits, len(error))}


def test_a_user_eval_step_on_dict_batches_reports_each_sum_over_its_count(
    world_of_one: None,
) -> None:
    del world_of_one
    data = Pixels(7)
    got = evaluate(
        torch.nn.Identity(),
        DataLoader(data, batch_size=3),
        step=step_of(pixel_error),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext(),
        slots=8,
    )
    error = (data.images - 1).abs()
    assert list(got) == ["val_pixel_error", "val_hits", "val_samples"]
    assert got["val_pixel_error"] == pytest.approx(error.sum().item() / 28)
    assert got["val_hits"] == (error.flatten(1).mean(dim=1) < 1).sum().item() / 7
    assert got["val_samples"] == 7


def test_a_user_eval_step_that_returns_the_wrong_shape_is_one_usage_error(
    world_of_one: None,
) -> None:
    del world_of_one

    def mean_only(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, object]:
        return {"pixel_error": model(batch["image"]).mean()}

    with pytest.raises(UsageError) as caught:
        evaluate(
            torch.nn.Identity(),
            DataLoader(Pixels(3), batch_size=2),
            step=step_of(mean_only),
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext(),
            slots=8,
        )
    line = caught.value.line()
    assert f"train.eval_step {__name__}:{mean_only.__qualname__} returned" in line
    assert "'pixel_error': a tensor of shape ()" in line


def test_an_eval_step_that_does_not_import_names_the_key() -> None:
    with pytest.raises(UsageError, match=r"train\.eval_step='no_such_pkg\.m:f': importing"):
        eval_step("no_such_pkg.m:f", kind="mse")


def test_the_builtin_metrics_are_exactly_rounded_sums_of_the_batches(world_of_one: None) -> None:
    """Each batch's float64 sums, added exactly: no order of addition can change a bit."""
    del world_of_one
    torch.manual_seed(3)
    inputs, targets = torch.randn(11, 4), torch.randint(0, 3, (11,))
    model = torch.nn.Linear(4, 3)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=4)
    got = evaluate(
        model,
        loader,
        step=eval_step("", kind="cross_entropy"),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext(),
        slots=3,
    )
    losses, correct = [], []
    with torch.no_grad():
        for batch_inputs, batch_targets in loader:
            outputs, count = model(batch_inputs), batch_targets.shape[0]
            loss = torch.nn.functional.cross_entropy(outputs.float(), batch_targets)
            losses.append(loss.double().item() * count)
            correct.append(float((outputs.argmax(dim=-1) == batch_targets).sum()))
    assert got == {
        "val_loss": math.fsum(losses) / 11,
        "val_accuracy": math.fsum(correct) / 11,
        "val_samples": 11,
    }


def test_the_builtin_metrics_on_dict_batches_ask_for_an_eval_step(world_of_one: None) -> None:
    del world_of_one
    with pytest.raises(UsageError) as caught:
        evaluate(
            torch.nn.Identity(),
            DataLoader(Pixels(3), batch_size=2),
            step=eval_step("", kind="mse"),
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext(),
            slots=8,
        )
    line = caught.value.line()
    assert "built-in validation metrics read (inputs, targets) batches, not a dict" in line
    assert "HINT: set train.eval_step" in line


def test_samples_is_not_a_user_metric_name(world_of_one: None) -> None:
    del world_of_one

    def samples(_model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, tuple]:
        return {"samples": (len(batch["image"]), 1)}

    with pytest.raises(UsageError, match="returned a metric named 'samples'"):
        evaluate(
            torch.nn.Identity(),
            DataLoader(Pixels(3), batch_size=2),
            step=step_of(samples),
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext(),
            slots=8,
        )


def test_a_metric_nothing_was_counted_for_is_nan(world_of_one: None) -> None:
    del world_of_one

    def never(_model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, tuple]:
        return {"hits": (0.0, 0), "err": (len(batch["image"]) * 0.5, len(batch["image"]))}

    got = evaluate(
        torch.nn.Identity(),
        DataLoader(Pixels(3), batch_size=2),
        step=step_of(never),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext(),
        slots=2,
    )
    assert math.isnan(got.pop("val_hits"))
    assert got == {"val_err": 0.5, "val_samples": 3}


def test_lockstep_forwards_make_up_a_ranks_missing_batches_and_count_for_nothing(
    world_of_one: None,
) -> None:
    # A sharded model's forward is collective: a rank with fewer batches than `slots` must
    # still make `slots` forwards, so the others' gathers are answered.
    del world_of_one
    model = torch.nn.Linear(3, 3)
    loader = DataLoader(TensorDataset(torch.eye(3), torch.tensor([0, 1, 2])), batch_size=2)
    modes: list[bool] = []

    def run(lockstep: Callable[[], None] | None) -> dict[str, float]:
        return evaluate(model, loader, step=eval_step("", kind="cross_entropy"),
                        device=torch.device("cpu"), autocast=contextlib.nullcontext(), slots=5,
                        lockstep=lockstep)  # fmt: skip

    padded = run(lambda: modes.append(model.training))
    assert modes == [False, False, False]  # 5 slots - 2 batches, in eval mode
    assert padded == run(None)
