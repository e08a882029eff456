"""module:function factories: import errors, wrong types and mismatches are one clear line."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

from trainbox.config import factories
from trainbox.errors import UsageError
from trainbox.train.data import contract
from trainbox.train.data.contract import Datasets

PAIRS = TensorDataset(torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))


class Stream(IterableDataset[Any]):
    """A user's own stream: every DataLoader worker and every rank would yield all of it."""

    def __iter__(self) -> Iterator[Any]:
        return iter([(torch.zeros(2), torch.tensor(0))] * 8)


class SizedStream(Stream):
    """A stream that also says its length, which a sampler-based loader would believe."""

    def __len__(self) -> int:
        return 8


@pytest.fixture
def user_module() -> Iterator[types.ModuleType]:
    """A stand-in for a user's package, importable as `user_pkg`."""
    module = types.ModuleType("user_pkg")
    module.model = lambda width=2: torch.nn.Linear(2, width)
    module.not_a_model = lambda: "a string"
    module.data = lambda: (PAIRS, PAIRS)
    module.data_object = lambda: Datasets(train=PAIRS)
    module.empty = lambda: (TensorDataset(torch.zeros(0, 2)), None)
    module.unsized = lambda: (iter([1, 2]), None)
    module.dict_data = lambda: {"train": PAIRS}
    module.stream = lambda: (Stream(), None)
    module.sized_stream = lambda: (SizedStream(), None)
    module.val_stream = lambda: (PAIRS, SizedStream())

    def buggy() -> torch.nn.Module:
        return len(5)  # type: ignore[arg-type]  # a bug in user code, not bad arguments

    module.buggy = buggy
    module.value = 3
    sys.modules["user_pkg"] = module
    yield module
    del sys.modules["user_pkg"]


def test_model_and_data(user_module: types.ModuleType) -> None:
    del user_module
    assert isinstance(factories.build_model("user_pkg:model", {"width": 3}), torch.nn.Linear)
    assert contract.build_data("user_pkg:data", {}).val is PAIRS
    assert contract.build_data("user_pkg:data_object", {}).val is None


@pytest.mark.parametrize(
    ("build", "path", "args", "message"),
    [
        (
            factories.build_model,
            "no_such_pkg.models:model",
            {},
            "importing 'no_such_pkg.models' failed (ModuleNotFoundError",
        ),
        (
            factories.build_model,
            "user_pkg:missing",
            {},
            "module 'user_pkg' has no callable 'missing'",
        ),
        (factories.build_model, "user_pkg:value", {}, "module 'user_pkg' has no callable 'value'"),
        (factories.build_model, "user_pkg:not_a_model", {}, "returned str, not a torch.nn.Module"),
        (factories.build_model, "user_pkg:model", {"depth": 3}, "does not accept these arguments"),
        (contract.build_data, "user_pkg:empty", {}, "the train dataset is empty"),
        (contract.build_data, "user_pkg:unsized", {}, "is not a sized map-style dataset"),
        (contract.build_data, "user_pkg:dict_data", {}, "returned dict"),
    ],
)
def test_bad_factories(
    user_module: types.ModuleType,
    build: Callable[[str, dict[str, Any]], object],
    path: str,
    args: dict[str, Any],
    message: str,
) -> None:
    del user_module
    with pytest.raises(UsageError) as caught:
        build(path, args)
    assert message in caught.value.line()


@pytest.mark.parametrize(
    ("path", "name", "kind"),
    [
        ("user_pkg:stream", "train", "Stream"),
        ("user_pkg:sized_stream", "train", "SizedStream"),
        ("user_pkg:val_stream", "val", "SizedStream"),
    ],
)
def test_a_users_iterable_dataset_is_refused_saying_what_to_use_instead(
    user_module: types.ModuleType, path: str, name: str, kind: str
) -> None:
    del user_module
    with pytest.raises(UsageError) as caught:
        contract.build_data(path, {})
    line = caught.value.line()
    assert f"the {name} dataset ({kind}) is an IterableDataset" in line
    assert "every rank and DataLoader worker would read all of it" in line
    assert "HINT: return a map-style dataset (__len__ and __getitem__)" in line
    assert "trainbox.tasks.shards:data" in line


def test_a_bug_inside_a_factory_keeps_its_traceback(user_module: types.ModuleType) -> None:
    del user_module
    with pytest.raises(TypeError, match="has no len"):
        factories.build_model("user_pkg:buggy", {})


def test_model_that_does_not_fit_the_data() -> None:
    data = Datasets(train=TensorDataset(torch.zeros(8, 3), torch.zeros(8, dtype=torch.long)))
    with pytest.raises(UsageError, match=r"inputs \(8, 3\) and targets \(8,\) fails"):
        contract.check_fit(torch.nn.Linear(2, 4), data, loss=torch.nn.functional.cross_entropy)


def test_dict_samples_without_a_train_step_are_one_clear_error() -> None:
    class Records:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"x": torch.zeros(2), "y": torch.tensor(0), "w": torch.tensor(1.0)}

    with pytest.raises(
        UsageError, match=r"needs \(inputs, target\) samples; .* collate to a dict of 3"
    ):
        contract.check_fit(
            torch.nn.Linear(2, 4), Datasets(train=Records()), loss=torch.nn.functional.cross_entropy
        )


def test_probe_restores_training_mode() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    contract.check_fit(model, Datasets(train=PAIRS), loss=torch.nn.functional.cross_entropy)
    assert model.training


def test_the_fit_check_runs_on_the_training_device() -> None:
    """On a GPU the check costs milliseconds; on the CPU a GPT-2-sized one took seconds."""
    model = torch.nn.Linear(2, 4).to("meta")  # a device other than the data's CPU
    contract.check_fit(
        model, Datasets(train=PAIRS), loss=torch.nn.functional.cross_entropy, device="meta"
    )


def test_the_user_step_probe_runs_on_the_training_device() -> None:
    from trainbox.train.steps.functions import Step, probe

    def step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        inputs, _ = batch
        return model(inputs).sum()

    probe(Step(fn=step, name="user:step"), torch.nn.Linear(2, 4).to("meta"), PAIRS, device="meta")
