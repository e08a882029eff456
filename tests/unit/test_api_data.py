"""`Trainer(data=...)` takes what a data factory may return (issue 19, item 12)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from trainbox import api, launch
from trainbox.errors import UsageError
from trainbox.train.data.contract import Datasets

PAIRS = TensorDataset(torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))
SESSION = api.Session(
    context=launch.single({}), device=torch.device("cpu"), backend="gloo", timeout_s=60.0
)


def trainer(data: Any) -> api.Trainer:
    config = api.load_config()
    return api.Trainer(config, SESSION, model=torch.nn.Linear(2, 2), data=data, cpu_count=1)


@pytest.mark.parametrize("data", [(PAIRS, PAIRS), [PAIRS, None], Datasets(train=PAIRS)])
def test_datasets_or_a_train_val_pair(data: Any) -> None:
    assert trainer(data).data.train is PAIRS


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"train": PAIRS}, "Trainer(data=...) got dict"),
        ((PAIRS,), "Trainer(data=...) got a tuple of 1"),
        ((PAIRS, TensorDataset(torch.zeros(0, 2))), "the val dataset is empty"),
    ],
)
def test_anything_else_is_one_line(data: Any, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        trainer(data)
    assert said in caught.value.line()
