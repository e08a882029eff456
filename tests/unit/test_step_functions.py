"""The step contracts: what a train or eval step may return, and the one-line error otherwise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainbox.errors import UsageError
from trainbox.train.steps.functions import (
    Step,
    builtin_eval_step,
    builtin_train_step,
    eval_sums,
    train_loss,
)

LOSS = torch.tensor(0.25)


def step_returning(value: Any) -> Step:
    return Step(fn=lambda _model, _batch: value, name="my_pkg.steps:train")


@pytest.mark.parametrize(
    ("returned", "extras"),
    [
        (LOSS, {}),
        (
            (LOSS, {"heatmap": torch.tensor(0.1), "presence": 0.15}),
            {"heatmap": torch.tensor(0.1), "presence": 0.15},
        ),
        (SimpleNamespace(loss=LOSS, logits=torch.zeros(2, 3)), {}),
        ({"loss": LOSS, "logits": torch.zeros(2, 3)}, {}),
    ],
    ids=["tensor", "loss-and-scalars", "output-with-loss-attribute", "output-with-loss-key"],
)
def test_accepted_train_step_results(returned: Any, extras: dict[str, Any]) -> None:
    loss, got = train_loss(step_returning(returned), None, None)
    assert loss is LOSS
    assert got == extras


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        (torch.zeros(4), "a tensor of shape (4,) and dtype torch.float32"),
        (0.5, "float 0.5"),
        (torch.tensor(3), "a tensor of shape () and dtype torch.int64"),
        ({"logits": torch.zeros(2)}, "dict {'logits'"),
        ((LOSS, {"iou": torch.zeros(3)}), "'iou': a tensor of shape (3,)"),
        ((LOSS, {"tag": "x"}), "'tag': str 'x'"),
    ],
    ids=["vector", "float", "integer-tensor", "dict-without-loss", "extra-vector", "extra-string"],
)
def test_bad_train_step_results_name_the_function_and_the_value(returned: Any, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        train_loss(step_returning(returned), None, None)
    line = caught.value.line()
    assert "train.step my_pkg.steps:train returned" in line
    assert said in line
    assert "HINT:" in line


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        (torch.tensor(1.0), "not a dict of metrics"),
        ({}, "not a dict of metrics"),
        ({"err": torch.tensor(2.0)}, "'err': a tensor of shape ()"),
        ({"err": (torch.zeros(3), 3)}, "'err': a tuple of 2"),
        ({"err": (1.0, 2, 3)}, "'err': a tuple of 3"),
    ],
)
def test_bad_eval_step_results_are_named(returned: Any, said: str) -> None:
    step = Step(fn=lambda _model, _batch: returned, name="loc.metrics:pixel_error")
    with pytest.raises(
        UsageError, match=r"train\.eval_step loc\.metrics:pixel_error returned"
    ) as caught:
        eval_sums(step, None, None)
    assert said in caught.value.line()


def test_builtin_steps_match_the_classic_loss() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4)
    inputs, targets = torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0])
    loss, _ = train_loss(builtin_train_step("cross_entropy"), model, (inputs, targets))
    assert torch.equal(loss, torch.nn.functional.cross_entropy(model(inputs), targets))
    sums = eval_sums(builtin_eval_step("cross_entropy"), model, (inputs, targets))
    assert sums["loss"][1] == 5
    assert float(sums["accuracy"][0]) == float((model(inputs).argmax(-1) == targets).sum())
