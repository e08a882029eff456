"""The step clock in the real loop (a world of one): where each step's time goes, the spread on
the train line, and `health.stragglers=false` leaving the line as it was; each second of a
window counted in one part (StepTimeTotals.per_step)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import tinyloop
from trainbox.health.step_clock import (
    COMPUTE,
    DATA,
    OUTSIDE,
    WAIT,
    StepClock,
    StepTimes,
    StepTimeTotals,
)

SPREAD = {"own_s_p50", "own_s_max", "compute_s_min", "compute_s_p50", "compute_s_max",
          "data_s_p50", "data_s_max", "outside_s_p50", "outside_s_max", "paused_s_p50",
          "paused_s_max", "allreduce_wait_s_mean", "slowest_rank"}  # fmt: skip


@pytest.fixture
def world_of_one() -> Iterator[None]:
    with tinyloop.world_of_one():
        yield


def train_lines(run_dir: Path, *overrides: str) -> list[dict[str, Any]]:
    loop = tinyloop.tiny_loop(run_dir, steps=40, overrides=["train.log_every=20", *overrides])
    try:
        loop.fit()
    finally:
        loop.close()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def test_each_train_line_carries_the_spread_of_step_times(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    lines = train_lines(tmp_path)
    assert len(lines) == 2
    for line in lines:
        assert line.keys() >= SPREAD
        assert line["slowest_rank"] == 0
        # One rank: its time is the minimum, the median and the maximum.
        assert line["compute_s_min"] == line["compute_s_p50"] == line["compute_s_max"] > 0
        assert line["compute_s_max"] <= line["step_time_s"]
        assert line["own_s_p50"] == line["own_s_max"] >= line["compute_s_max"]


def test_switched_off_the_train_line_is_as_before(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    lines = train_lines(tmp_path, "health.stragglers=false")
    assert lines
    assert not SPREAD & set().union(*(line.keys() for line in lines))


def test_switched_off_nothing_times_the_steps(world_of_one: None, tmp_path: Path) -> None:
    # A clock nobody reads would only cost: on a GPU it would keep four CUDA events per step
    # for the whole run, since only the straggler detector takes its windows.
    del world_of_one
    loop = tinyloop.tiny_loop(tmp_path, steps=4, overrides=["health.stragglers=false"])
    try:
        hooked = [p for p in loop.module.parameters() if p._post_accumulate_grad_hooks]
        assert hooked == []
        loop.fit()
        assert loop.clock.steps == 0
    finally:
        loop.close()


def test_a_step_splits_into_compute_data_wait_and_all_reduce_wait() -> None:
    model = torch.nn.Linear(3, 2)
    clock = StepClock(model)
    clock.begin()
    time.sleep(0.02)  # this rank's own work
    model(torch.ones(1, 3)).sum().backward()  # the gradient hook stamps "last gradient ready"
    time.sleep(0.03)  # waiting in the all-reduce for slower ranks
    clock.synced()
    clock.end(0.01)  # it also waited 10 ms for its batch
    time.sleep(0.02)  # between steps (a log point)
    window = clock.take()
    times = window.per_step()
    assert window.steps == 1
    assert times.data == 0.01
    assert 0.03 <= times.wait < 0.05
    assert 0.01 <= times.compute < 0.03
    assert 0.02 <= times.outside < 0.04
    assert times.own + times.wait == pytest.approx(window.wall_s)
    empty = clock.take()
    assert (empty.steps, empty.step_s, empty.data_s, empty.wait_s) == (0, 0.0, 0.0, 0.0)
    clock.close()


def test_a_step_whose_hooked_gradients_never_came_waits_for_nothing() -> None:
    model = torch.nn.Linear(3, 2)
    clock = StepClock(model)
    clock.begin()
    clock.synced()
    clock.end(0.0)
    assert clock.take().wait_s == 0.0
    clock.close()


def test_under_fsdp_the_wait_is_the_time_in_every_units_gathers(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slower peer, simulated where a rank sees it: fsdp's wait for a unit's all-gather takes
    # 10 ms longer (one rank alone has no peer to wait for).
    del world_of_one
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    gathered = FSDPParamGroup.wait_for_unshard

    def slow_gather(group: FSDPParamGroup) -> None:
        time.sleep(0.01)
        gathered(group)

    monkeypatch.setattr(FSDPParamGroup, "wait_for_unshard", slow_gather)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    for unit in model:
        fully_shard(unit)
    fully_shard(model)
    clock = StepClock(model)
    model(torch.ones(1, 3)).sum().backward()  # outside a step (as an eval is): not counted
    assert clock.wait_s == 0.0
    clock.begin()
    model(torch.ones(1, 3)).sum().backward()
    clock.synced()
    clock.end(0.0)
    window = clock.take()
    # Two units, each gathered in forward and again in backward.
    assert 0.04 <= window.wait_s <= window.step_s
    clock.close()  # removes the hooks: nothing is timed after
    clock.begin()
    model(torch.ones(1, 3)).sum().backward()
    clock.end(0.0)
    assert clock.take().wait_s == 0.0


def test_a_window_starts_when_the_log_point_ends_on_every_rank() -> None:
    clock = StepClock(torch.nn.Linear(3, 2))
    clock.window_starts()  # before any step: the first window starts with the first step
    time.sleep(0.01)
    clock.begin()
    clock.end(0.0)
    assert clock.take().wall_s < 0.01
    time.sleep(0.02)  # the log point's all-reduce: not this rank's time
    clock.window_starts()
    clock.begin()
    clock.end(0.0)
    assert clock.take().wall_s < 0.02
    clock.close()


def test_a_window_starts_with_the_step_the_log_point_overlaps() -> None:
    # The loop takes the log point's result after the next step: the window starts with it.
    clock = StepClock(torch.nn.Linear(3, 2))
    clock.begin()
    clock.end(0.0)
    clock.take()  # the log point's share
    clock.begin()
    time.sleep(0.02)  # the next step, with the log point's all-reduce in flight
    clock.end(0.0)
    clock.window_starts()  # the loop settles that log point
    window = clock.take()
    assert window.steps == 1
    assert window.wall_s >= window.step_s >= 0.02
    clock.close()


def totals(*, paused: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)) -> StepTimeTotals:
    """Two steps: 60 ms each, of which 10 ms data and 30 ms wait; 20 ms between them."""
    return StepTimeTotals(steps=2, step_s=0.12, data_s=0.02, wait_s=0.06, wall_s=0.16,
                          paused_s=paused)  # fmt: skip


def pauses_in(part: int, seconds: float) -> tuple[float, float, float, float]:
    lost = [0.0] * 4
    lost[part] = seconds
    return (lost[0], lost[1], lost[2], lost[3])


# (the window's totals, its parts per step): each second in one part, own = wall - wait.
PER_STEP = [
    pytest.param(
        totals(),
        StepTimes(compute=0.02, data=0.01, wait=0.03, outside=0.02, paused=0.0),
        id="no-pause",
    ),
    pytest.param(
        totals(paused=pauses_in(WAIT, 0.04)),
        StepTimes(compute=0.02, data=0.01, wait=0.01, outside=0.02, paused=0.02),
        id="paused-in-the-collective-holds-the-others",
    ),
    pytest.param(
        totals(paused=pauses_in(COMPUTE, 0.02)),
        StepTimes(compute=0.01, data=0.01, wait=0.03, outside=0.02, paused=0.01),
        id="paused-in-its-own-work",
    ),
    pytest.param(
        totals(paused=pauses_in(DATA, 0.02)),
        StepTimes(compute=0.02, data=0.0, wait=0.03, outside=0.02, paused=0.01),
        id="paused-while-fetching",
    ),
    pytest.param(
        totals(paused=pauses_in(OUTSIDE, 0.04)),
        StepTimes(compute=0.02, data=0.01, wait=0.03, outside=0.0, paused=0.02),
        id="paused-between-steps",
    ),
    pytest.param(
        totals(paused=pauses_in(DATA, 0.06)),
        StepTimes(compute=0.02, data=0.0, wait=0.03, outside=0.02, paused=0.03),
        id="a-pause-longer-than-its-part-leaves-it-at-zero",
    ),
]


@pytest.mark.parametrize(("window", "expected"), PER_STEP)
def test_each_second_of_a_window_counts_in_one_part(
    window: StepTimeTotals, expected: StepTimes
) -> None:
    times = window.per_step()
    for name in ("compute", "data", "wait", "outside", "paused"):
        assert getattr(times, name) == pytest.approx(getattr(expected, name), abs=1e-12), name
    if all(getattr(times, name) > 0 or name == "paused" for name in ("compute", "data", "outside")):
        assert times.own + times.wait == pytest.approx(window.wall_s / window.steps)
