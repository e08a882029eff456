"""With train.async_save, the writer copies the weights while the next step's forward and
backward run, and the trainer's optimizer step waits for that copy (the saver's settle).

The writer's copy of the stable tensors is held until the training thread either settles (it
waits for the copy, as it must) or starts an optimizer step without settling (the copy would
race the update). The order of "copied" and "update" then tells which happened.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import tinyloop
from trainbox.checkpoint import files as checkpoint
from trainbox.checkpoint.saver import BackgroundSaver


@pytest.fixture
def world_of_one() -> Iterator[None]:
    with tinyloop.world_of_one():
        yield


def fit(run_dir: Path, *, steps: int, extra: list[str]) -> dict[str, Any]:
    """One whole fit of the tiny loop, checkpointing every 2 steps; its summary."""
    overrides = ["train.ckpt_every=2", "train.keep_last=10", "optim.name=adamw", *extra]
    loop = tinyloop.tiny_loop(run_dir, steps=steps, overrides=overrides)
    try:
        return loop.fit()
    finally:
        loop.close()


class Order:
    """Records "copied" and "update" in the order they happen; holds the copy as described
    (and until the end's join, which waits for the last save)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[str] = []
        self.waited = threading.Event()
        self.submitting = False
        copy, settle, join = BackgroundSaver._copy, BackgroundSaver.settle, BackgroundSaver.join
        submit = BackgroundSaver.submit

        def held_copy(saver: BackgroundSaver, *args: Any) -> Any:
            assert self.waited.wait(30)
            copied = copy(saver, *args)
            self.events.append("copied")
            return copied

        def cleared_submit(saver: BackgroundSaver, *args: Any, **kwargs: Any) -> None:
            self.waited.clear()
            self.submitting = True  # its own join (of the previous save) releases nothing
            try:
                submit(saver, *args, **kwargs)
            finally:
                self.submitting = False

        def releasing_settle(saver: BackgroundSaver) -> None:
            self.waited.set()
            settle(saver)

        def releasing_join(saver: BackgroundSaver) -> Path | None:
            if not self.submitting:
                self.waited.set()
            return join(saver)

        def recorded_update(optimizer: torch.optim.Optimizer, *args: Any) -> None:
            del optimizer, args
            self.events.append("update")
            self.waited.set()  # without a settle first, the copy now races this update

        monkeypatch.setattr(BackgroundSaver, "_copy", held_copy)
        monkeypatch.setattr(BackgroundSaver, "submit", cleared_submit)
        monkeypatch.setattr(BackgroundSaver, "settle", releasing_settle)
        monkeypatch.setattr(BackgroundSaver, "join", releasing_join)
        # Every optimizer's step, through torch's global pre-step hook: the weights change next.
        self.hook = register_optimizer_step_pre_hook(recorded_update)


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="defaults"),
        pytest.param(["train.grad_accum=2", "train.clip_grad_norm=1.0"], id="accum-and-clip"),
    ],
)
def test_the_optimizer_step_after_a_background_save_waits_for_the_copy(
    world_of_one: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str]
) -> None:
    del world_of_one
    order = Order(monkeypatch)
    try:
        fit(tmp_path, steps=6, extra=["train.async_save=true", *extra])
    finally:
        order.hook.remove()
    # Background saves at steps 2, 4 and 6; the one at 6 is copied when the end joins it.
    saved = ["update", "update", "copied"]
    assert order.events == saved * 3


def test_background_checkpoints_hold_what_foreground_ones_do(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    background = fit(tmp_path / "bg", steps=6, extra=["train.async_save=true"])
    foreground = fit(tmp_path / "fg", steps=6, extra=["train.async_save=false"])
    assert background.params_sha256 == foreground.params_sha256
    for step in (2, 4, 6):
        ours = checkpoint.load(checkpoint.path_for(tmp_path / "bg" / "checkpoints", step))
        theirs = checkpoint.load(checkpoint.path_for(tmp_path / "fg" / "checkpoints", step))
        assert all(ours["model"][k].equal(v) for k, v in theirs["model"].items())
        assert ours["optimizer"]["state"].keys() == theirs["optimizer"]["state"].keys()
        for key, state in theirs["optimizer"]["state"].items():
            assert all(ours["optimizer"]["state"][key][k].equal(v) for k, v in state.items())
