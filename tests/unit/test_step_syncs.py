"""The training step never waits for the device: trainbox's code calls nothing that copies a
tensor to the host (`.item()`, `.tolist()`, `.cpu()`, `bool(t)`...) except at log points.

On a GPU each such call stalls the host until the device catches up, once per step. The calls
are counted on CPU tensors through a TorchFunctionMode, which sees every tensor method call.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.overrides import TorchFunctionMode

import tinyloop
import trainbox

# Tensor methods that make the host wait for the device (on a GPU tensor).
SYNCING = frozenset(
    {"item", "tolist", "cpu", "numpy", "__array__", "__bool__", "__float__", "__int__",
     "__index__", "nonzero", "any", "all"}
)  # fmt: skip
TRAINBOX = str(Path(trainbox.__file__).parent)


class SyncCounter(TorchFunctionMode):
    """Counts syncing tensor calls made by trainbox's own code on the training thread."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.thread = threading.get_ident()

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = getattr(func, "__name__", "")
        if name in SYNCING and threading.get_ident() == self.thread:
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(TRAINBOX):
                self.calls[f"{name} in {Path(caller.f_code.co_filename).name}"] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def world_of_one() -> Iterator[None]:
    with tinyloop.world_of_one():
        yield


def syncs_in_a_run(run_dir: Path, *, steps: int, extra: list[str]) -> Counter[str]:
    """Syncing calls trainbox made in a whole fit of `steps` steps (one log line, at the end)."""
    loop = tinyloop.tiny_loop(run_dir, steps=steps, overrides=["train.ckpt_every=0", *extra])
    counter = SyncCounter()
    try:
        with counter:
            loop.fit()
    finally:
        loop.close()
    return counter.calls


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="defaults"),
        pytest.param(["train.grad_accum=3", "train.clip_grad_norm=1.0"], id="accum-and-clip"),
    ],
)
def test_more_steps_make_no_more_host_syncs(
    world_of_one: None, tmp_path: Path, extra: list[str]
) -> None:
    del world_of_one
    few = syncs_in_a_run(tmp_path / "few", steps=2, extra=extra)
    many = syncs_in_a_run(tmp_path / "many", steps=12, extra=extra)
    # The same start-up, log line and summary: any difference is a sync on every step.
    assert many == few
    # The counter does see trainbox's syncs: the log line reads its all-reduced sums.
    assert few["tolist in metrics.py"] == 1
