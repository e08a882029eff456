"""The built-in schedule's lean step gives what torch's LambdaLR gives, bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainbox.train import schedule
from trainbox.train.optim import BuiltinSchedule

STEPS = 60


def optimizer(groups: int, lr: float | torch.Tensor) -> torch.optim.Optimizer:
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(groups)]
    # A tensor lr is filled in place: each run gets its own.
    return torch.optim.AdamW(params, lr=lr.clone() if isinstance(lr, torch.Tensor) else lr)


def run(scheduler: type[torch.optim.lr_scheduler.LambdaLR], **how: Any) -> tuple[list[Any], dict]:
    """Every step's (group lrs, last lrs, epoch, step count), and the final state_dict."""
    opt = optimizer(how["groups"], how["lr"])
    sched = scheduler(
        opt,
        lambda step: schedule.lr_factor(
            step, warmup=how["warmup"], total=STEPS, kind=how["kind"], min_ratio=0.1
        ),
    )
    seen = []
    for _ in range(STEPS):
        opt.step()
        sched.step()
        lrs = [float(g["lr"]) for g in opt.param_groups]
        last = [float(lr) for lr in sched.get_last_lr()]
        seen.append((lrs, last, sched.last_epoch, sched._step_count))
    state = sched.state_dict()
    state.pop("lr_lambdas")
    return seen, state


CASES = {
    "cosine with warmup": {"kind": "cosine", "warmup": 7, "groups": 1, "lr": 3e-3},
    "cosine": {"kind": "cosine", "warmup": 0, "groups": 1, "lr": 1e-3},
    "constant": {"kind": "constant", "warmup": 5, "groups": 1, "lr": 0.1},
    "two groups (torch's path)": {"kind": "cosine", "warmup": 3, "groups": 2, "lr": 3e-3},
    "tensor lr (torch's path)": {
        "kind": "cosine",
        "warmup": 3,
        "groups": 1,
        "lr": torch.tensor(3e-3),
    },
}


@pytest.mark.parametrize("how", CASES.values(), ids=CASES.keys())
def test_the_lean_step_matches_lambdalr_bit_for_bit(how: dict[str, Any]) -> None:
    assert run(BuiltinSchedule, **how) == run(torch.optim.lr_scheduler.LambdaLR, **how)


def test_a_tensor_lr_stays_a_tensor() -> None:
    opt = optimizer(1, torch.tensor(3e-3))
    sched = BuiltinSchedule(opt, lambda _step: 0.5)
    for _ in range(3):
        opt.step()
        sched.step()
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)


def test_a_state_dict_round_trips_into_a_lambdalr() -> None:
    how = CASES["cosine with warmup"]
    _, state = run(BuiltinSchedule, **how)
    opt = optimizer(1, how["lr"])
    plain = torch.optim.lr_scheduler.LambdaLR(opt, lambda _step: 1.0)
    plain.load_state_dict({**state, "lr_lambdas": [None]})
    assert plain.last_epoch == STEPS
    assert plain.get_last_lr() == state["_last_lr"]
