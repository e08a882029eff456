"""Learning-rate scaling and schedule shapes."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from trainbox.train.steps import optim


@pytest.mark.parametrize(
    ("mode", "expected"), [("none", 0.1), ("linear", 0.1 * 8), ("sqrt", 0.1 * math.sqrt(8))]
)
def test_scaled_lr(mode: str, expected: float) -> None:
    assert optim.scaled_lr(0.1, world_size=4, grad_accum=2, mode=mode) == pytest.approx(expected)


def factor(step: int, kind: str = "cosine", min_ratio: float = 0.0) -> float:
    return optim.lr_factor(step, warmup=10, total=110, kind=kind, min_ratio=min_ratio)


def test_warmup_rises_linearly_to_the_peak() -> None:
    assert [factor(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])


def test_cosine_decays_from_peak_to_the_floor() -> None:
    assert factor(10) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.5)
    assert factor(110) == pytest.approx(0.0)
    assert factor(110, min_ratio=0.1) == pytest.approx(0.1)
    assert factor(500) == pytest.approx(0.0)


def test_constant_stays_at_the_peak() -> None:
    assert {factor(s, kind="constant") for s in (10, 50, 109)} == {1.0}


def test_no_warmup_starts_at_the_peak() -> None:
    assert optim.lr_factor(0, warmup=0, total=10, kind="cosine", min_ratio=0) == 1.0


@pytest.mark.parametrize("min_ratio", [0.0, 0.1, 1 / 3])
def test_the_bound_factors_are_the_cosine_formula_bit_for_bit(min_ratio: float) -> None:
    # Checkpoints and pinned fingerprints hold lrs computed this way before the factors were
    # bound once per run: the same float operations in the same order, so == holds.
    warmup, total = 7, 1000
    factors = optim.lr_factors(warmup=warmup, total=total, kind="cosine", min_ratio=min_ratio)
    for step in range(warmup, total + 50):
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        formula = min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        assert factors(step) == formula, step


def schedules(lrs: list[float]) -> tuple[Any, Any]:
    """The built-in schedule and torch's LambdaLR on twin optimizers, same factors."""
    factors = optim.lr_factors(warmup=5, total=40, kind="cosine", min_ratio=0.1)
    made = []
    for kind in (optim.BuiltinSchedule, torch.optim.lr_scheduler.LambdaLR):
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
        made.append(kind(torch.optim.AdamW(groups), factors))
    return made[0], made[1]


@pytest.mark.parametrize("lrs", [[3e-3], [1e-3, 2.5e-4]])
def test_the_built_in_schedule_steps_as_lambda_lr_does_bit_for_bit(lrs: list[float]) -> None:
    ours, torchs = schedules(lrs)
    for _ in range(50):
        ours.optimizer.step()
        torchs.optimizer.step()
        ours.step()
        torchs.step()
        assert [g["lr"] for g in ours.optimizer.param_groups] == [
            g["lr"] for g in torchs.optimizer.param_groups
        ]
        assert ours.get_last_lr() == torchs.get_last_lr()
    # Checkpoints hold the state_dict: the same keys and values load either way.
    assert ours.state_dict() == torchs.state_dict()


def test_the_built_in_schedule_loads_lambda_lr_state_and_resumes_alike() -> None:
    ours, torchs = schedules([3e-3])
    for _ in range(12):
        torchs.optimizer.step()
        torchs.step()
    ours.load_state_dict(torchs.state_dict())
    ours.optimizer.param_groups[0]["lr"] = torchs.optimizer.param_groups[0]["lr"]
    for _ in range(5):
        ours.step()
        torchs.step()
    assert ours.get_last_lr() == torchs.get_last_lr()
    assert ours.state_dict() == torchs.state_dict()


def test_a_tensor_lr_is_filled_in_place_as_torch_does() -> None:
    # A user's optimizer (optim.factory) may hold its lr as a tensor; torch fills it in place.
    lr = torch.tensor(3e-3)
    param = torch.nn.Parameter(torch.zeros(1))
    factors = optim.lr_factors(warmup=5, total=40, kind="cosine", min_ratio=0.0)
    schedule = optim.BuiltinSchedule(torch.optim.AdamW([param], lr=lr), factors)
    held = schedule.optimizer.param_groups[0]["lr"]
    for _ in range(3):
        schedule.optimizer.step()
        schedule.step()
    assert schedule.optimizer.param_groups[0]["lr"] is held
    assert float(held) == pytest.approx(3e-3 * factors(3))
