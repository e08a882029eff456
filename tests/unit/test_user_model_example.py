"""The user-model example: a package that never imports trainbox builds through the factories."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import yaml

from trainbox import config
from trainbox.config import factories
from trainbox.train.data import contract

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "examples" / "user_model"
CONFIG = PACKAGE / "config.yaml"
LOSSES = {"cross_entropy": torch.nn.functional.cross_entropy, "mse": torch.nn.functional.mse_loss}


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, object]]:
    """The example on sys.path, as PYTHONPATH=examples/user_model does; its config as read."""
    monkeypatch.syspath_prepend(str(PACKAGE))
    # A my_model imported by an earlier test (or installed) must not shadow this checkout.
    for name in [name for name in sys.modules if name.split(".")[0] == "my_model"]:
        monkeypatch.delitem(sys.modules, name)
    return yaml.safe_load(CONFIG.read_text())


def test_factories_build_and_model_fits_the_data(on_path: dict[str, dict[str, object]]) -> None:
    model_section, data_section = on_path["model"], on_path["data"]
    model = factories.build_model(str(model_section["factory"]), model_section["args"])
    got = contract.build_data(str(data_section["factory"]), data_section["args"])
    assert (len(got.train), len(got.val)) == (4000, 1000)
    loader = torch.utils.data.DataLoader(got.train, batch_size=16)
    inputs, targets = next(iter(loader))
    outputs = model(inputs)
    assert outputs.shape == (16, model_section["args"]["num_classes"])
    loss = LOSSES[on_path["train"]["loss"]](outputs, targets)
    assert loss.isfinite()
    loss.backward()


def test_data_is_the_same_on_every_call(on_path: dict[str, dict[str, object]]) -> None:
    # Every rank calls the factory itself; the shards only line up if all build the same data.
    args = on_path["data"]["args"]
    first = contract.build_data(str(on_path["data"]["factory"]), args)
    torch.manual_seed(12345)  # the global RNG must not matter
    second = contract.build_data(str(on_path["data"]["factory"]), args)
    assert torch.equal(first.train.inputs, second.train.inputs)
    assert torch.equal(first.val.targets, second.val.targets)
    assert not torch.equal(first.train.inputs[:100], first.val.inputs[:100])


def test_same_seed_builds_the_same_weights(on_path: dict[str, dict[str, object]]) -> None:
    # trainbox seeds torch with the run's seed before calling the factory on every rank.
    def build() -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = factories.build_model(str(on_path["model"]["factory"]), on_path["model"]["args"])
        return model.state_dict()

    first, second = build(), build()
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_my_model_does_not_import_trainbox() -> None:
    sources = sorted((PACKAGE / "my_model").rglob("*.py"))
    assert sources
    for source in sources:
        assert not re.search(r"^\s*(import|from)\s+trainbox\b", source.read_text(), re.M), source
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    assert [dep.split(">")[0] for dep in project["dependencies"]] == ["torch"]


def test_example_configs_load() -> None:
    for path in (CONFIG, ROOT / "examples" / "tabular" / "config.yaml"):
        config.load(str(path), [])
    settings = config.load(str(CONFIG), [])
    assert settings.model.factory == "my_model.factories:model"
    assert settings.data.factory == "my_model.factories:data"
