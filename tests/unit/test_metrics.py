"""The loss sums: a NaN/Inf loss since the last check stops the run at the next log point or
checkpoint check, found from the sums alone (no per-step isfinite, no per-step sync). A log
point's all-reduces go out at its step and its line is written when the loop settles it."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from trainbox.errors import UsageError
from trainbox.train.steps.functions import builtin_train_step
from trainbox.train.steps.user_code import UserCode
from trainbox.train.watch.metrics import FOLD, MetricsFile, StepMetrics
from trainbox.train.watch.progress import Progress


@pytest.fixture
def world_of_one() -> Iterator[None]:
    # An in-memory store: a real gloo group with no port and nothing left behind.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def metrics(tmp_path: Path, *, world_size: int = 1) -> StepMetrics:
    stats = StepMetrics(
        MetricsFile(tmp_path / "metrics.jsonl", enabled=True),
        device=torch.device("cpu"),
        world_size=world_size,
        user_code=UserCode(step=builtin_train_step("cross_entropy")),
        last_good=lambda: "no checkpoint yet",
        start_step=0,
        last_loss=None,
    )
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
        stats.log(3, epoch=0, lr=0.1, progress=Progress(3, enabled=False))
        with pytest.raises(UsageError, match="between steps 1 and 3"):
            stats.settle()
    else:
        stats.log(3, epoch=0, lr=0.1, progress=Progress(3, enabled=False))
        stats.settle()
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
            stats.settle()
    assert stats.last_loss == pytest.approx(15.0)


def test_a_log_point_writes_its_line_when_the_loop_settles_it(
    world_of_one: None, tmp_path: Path
) -> None:
    # Its all-reduces overlap the next step instead of holding the loop at the log point.
    del world_of_one
    stats = metrics(tmp_path)
    stats.add(torch.tensor(1.0), 4)
    stats.log(1, epoch=0, lr=0.1, progress=Progress(2, enabled=False))
    assert not (tmp_path / "metrics.jsonl").exists()
    stats.settle()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["step"] == 1


def test_a_step_taken_before_the_settle_counts_in_the_next_line(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    stats = metrics(tmp_path)
    progress = Progress(2, enabled=False)
    stats.add(torch.tensor(1.0), 4)
    stats.log(1, epoch=0, lr=0.1, progress=progress)
    stats.add(torch.tensor(100.0), 4)
    stats.settle()
    assert stats.last_loss == 1.0
    stats.log(2, epoch=0, lr=0.1, progress=progress)
    stats.settle()
    assert stats.last_loss == 100.0


def test_the_check_before_a_checkpoint_settles_the_log_point_first(
    world_of_one: None, tmp_path: Path
) -> None:
    # No checkpoint may be written after a NaN that a log point in flight carries.
    del world_of_one
    stats = metrics(tmp_path)
    stats.add(torch.tensor(math.nan), 4)
    stats.log(1, epoch=0, lr=0.1, progress=Progress(1, enabled=False))
    with pytest.raises(UsageError, match="between steps 1 and 1"):
        stats.check_finite(1)


def test_a_train_line_names_the_world_size_it_ran_at(world_of_one: None, tmp_path: Path) -> None:
    # An elastic run re-forms at another size between restarts: each line says which.
    del world_of_one
    # The size the loop was given, whatever group the all-reduce runs in here.
    stats = metrics(tmp_path, world_size=3)
    stats.add(torch.tensor(1.0), 4)
    stats.log(1, epoch=0, lr=0.1, progress=Progress(1, enabled=False))
    stats.settle()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["world_size"] == 3


def test_a_window_longer_than_the_fold_averages_every_loss_and_holds_few(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    stats = metrics(tmp_path)
    steps = 2 * FOLD + 3
    for step in range(1, steps + 1):
        stats.add(torch.tensor(float(step)), 4)
        assert len(stats.losses.pending) < FOLD
    stats.log(steps, epoch=0, lr=0.1, progress=Progress(steps, enabled=False))
    stats.settle()
    assert stats.last_loss == (steps + 1) / 2


def test_a_check_inside_a_long_window_sees_only_later_losses_across_folds(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    stats = metrics(tmp_path)
    for _ in range(FOLD - 1):  # a check just before the first fold
        stats.add(torch.tensor(1.0), 4)
    stats.check_finite(FOLD - 1)
    for _ in range(3):  # the fold comes with the first of these
        stats.add(torch.tensor(2.0), 4)
    stats.check_finite(FOLD + 2)
    stats.add(torch.tensor(math.nan), 4)
    for _ in range(FOLD):  # folded in with good losses after it
        stats.add(torch.tensor(1.0), 4)
    with pytest.raises(UsageError, match=f"between steps {FOLD + 3} and {2 * FOLD + 3}"):
        stats.check_finite(2 * FOLD + 3)


def test_the_window_average_keeps_losses_a_check_has_seen(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    stats = metrics(tmp_path)
    for loss in (1.0, 3.0):
        stats.add(torch.tensor(loss), 4)
    stats.check_finite(2)
    stats.add(torch.tensor(5.0), 4)
    stats.log(3, epoch=0, lr=0.1, progress=Progress(3, enabled=False))
    stats.settle()
    assert stats.last_loss == 3.0
