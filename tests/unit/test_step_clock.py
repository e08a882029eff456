"""The step clock in the real loop (a world of one): where each step's time goes, the spread on
the train line, and `health.stragglers=false` leaving the line as it was."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import tinyloop
from trainbox.health.step_clock import StepClock, StepTimeTotals

SPREAD = {"compute_s_min", "compute_s_p50", "compute_s_max", "data_s_p50", "data_s_max",
          "allreduce_wait_s_mean", "slowest_rank"}  # fmt: skip


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
    window = clock.take()
    compute, data, wait = window.per_step()
    assert window.steps == 1
    assert data == 0.01
    assert 0.03 <= wait < 0.05
    assert 0.01 <= compute < 0.03
    assert clock.take() == StepTimeTotals(steps=0, step_s=0.0, data_s=0.0, wait_s=0.0)
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
