"""The example packages' own code, without trainbox: the locator decodes a clean heatmap to the
blob's pixel, its optimizer leaves biases and norms undecayed, and the churn EMA moves."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Both packages on sys.path, as PYTHONPATH=examples/<name> puts them."""
    for name in ("locator", "tabular_dict"):
        monkeypatch.syspath_prepend(str(EXAMPLES / name))
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("locator", "churn")]:
        del sys.modules[name]


def module(name: str) -> ModuleType:
    __import__(name)
    return sys.modules[name]


@pytest.mark.usefixtures("importable")
def test_the_locator_decodes_a_target_heatmap_to_the_blobs_pixel() -> None:
    train = module("locator.train")
    # Blobs lie 4 px or more inside the tile (twice their sigma): the extremes and between.
    positions = torch.tensor([[4.0, 59.0], [31.3, 17.8], [50.5, 6.0]])
    batch = {"position": positions, "present": torch.ones(3), "image": torch.zeros(3, 4, 64, 64)}
    heatmap = train.target_heatmap(batch, 16)
    # A log-parabola through a sampled Gaussian finds its centre, well inside a 4-pixel cell.
    assert (train.locate(heatmap) - positions).abs().max() < 0.05
    # Without a bump, or with a flat one, it stays on a cell's centre.
    flat = train.locate(torch.zeros(1, 16, 16))
    assert flat.tolist() == [[1.5, 1.5]]


@pytest.mark.usefixtures("importable")
def test_the_locator_optimizer_decays_only_conv_and_linear_weights() -> None:
    net = module("locator.model").model()
    decayed, undecayed = (
        module("locator.train").optimizer(net, lr=1e-3, weight_decay=0.1).param_groups
    )
    names = {id(p): name for name, p in net.named_parameters()}
    assert decayed["weight_decay"] == 0.1
    assert undecayed["weight_decay"] == 0.0
    assert all(names[id(p)].endswith("weight") and p.ndim > 1 for p in decayed["params"])
    assert {names[id(p)] for p in undecayed["params"]} == {
        name for name, p in net.named_parameters() if p.ndim == 1
    }


@pytest.mark.usefixtures("importable")
def test_the_churn_ema_follows_the_weights_and_round_trips() -> None:
    churn = module("churn.train")
    net = module("churn.model").model()
    ema = churn.state(net, None)["ema"]
    before = {k: v.clone() for k, v in ema.shadow.items()}
    with torch.no_grad():
        for param in net.parameters():
            param.add_(1.0)
    ema.after_step(1)
    moved = ema.shadow["embed.weight"] - before["embed.weight"]
    assert 0 < float(moved.mean()) < 1
    again = churn.state(net, None)["ema"]
    again.load_state_dict(ema.state_dict())
    assert again.updates == 1
    assert all(torch.equal(again.shadow[k], ema.shadow[k]) for k in ema.shadow)
