"""The loss sums: a NaN/Inf loss since the last check stops the run at the next log point or
checkpoint check, found from the sums alone (no per-step isfinite, no per-step sync)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from trainbox.errors import UsageError
from trainbox.train.objective import builtin_train_step
from trainbox.train.progress import Progress
from trainbox.train.runfiles import MetricsFile
from trainbox.train.seams import Seams
from trainbox.train.step_metrics import StepMetrics


@pytest.fixture
def world_of_one() -> Iterator[None]:
    # An in-memory store: a real gloo group with no port and nothing left behind.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def metrics(tmp_path: Path) -> StepMetrics:
    stats = StepMetrics(
        MetricsFile(tmp_path / "metrics.jsonl", enabled=True),
        device=torch.device("cpu"),
        world_size=1,
        seams=Seams(step=builtin_train_step("cross_entropy")),
        last_good=lambda: "no checkpoint yet",
    )
    stats.start(0)
    return stats


@pytest.mark.parametrize(
    ("losses", "bad"),
    [
        ([1.0, 2.0, 3.0], False),
        ([1.0, math.nan, 3.0], True),
        ([math.inf, 1.0], True),
        ([math.inf, -math.inf], True),  # their sum is NaN: still caught
    ],
)
def test_a_non_finite_loss_stops_at_the_log_point(
    world_of_one: None, tmp_path: Path, losses: list[float], bad: bool
) -> None:
    del world_of_one
    stats = metrics(tmp_path)
    for loss in losses:
        stats.add(torch.tensor(loss), 4)
    if bad:
        with pytest.raises(UsageError, match="between steps 1 and 3"):
            stats.log(3, epoch=0, lr=0.1, progress=Progress(3, enabled=False))
    else:
        stats.log(3, epoch=0, lr=0.1, progress=Progress(3, enabled=False))
        assert stats.last_loss == pytest.approx(2.0)


def test_the_check_before_a_checkpoint_sees_only_losses_since_the_last_check(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    stats = metrics(tmp_path)
    stats.add(torch.tensor(1.0), 4)
    stats.check_finite(1)
    stats.add(torch.tensor(math.nan), 4)
    with pytest.raises(UsageError, match="between steps 2 and 2"):
        stats.check_finite(2)


def test_a_log_line_averages_its_window_only(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    stats = metrics(tmp_path)
    progress = Progress(4, enabled=False)
    for step, loss in enumerate([1.0, 3.0, 10.0, 20.0], start=1):
        stats.add(torch.tensor(loss), 4)
        if step % 2 == 0:
            stats.log(step, epoch=0, lr=0.1, progress=progress)
    assert stats.last_loss == pytest.approx(15.0)
