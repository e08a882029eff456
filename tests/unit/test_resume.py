"""Judging a checkpoint to resume from (train/resume.py): what it must hold besides weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from trainbox.checkpoint.schema import Payload
from trainbox.config import Config, as_dict
from trainbox.train.resume import Found, judge
from trainbox.train.state import TrainState
from trainbox.train.user_code import choose


def state_for(config: Config) -> TrainState:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    return TrainState(
        config, model, user_code=choose(config), world_size=1, device=torch.device("cpu"),
        amp_dtype=None,
    )  # fmt: skip


def found(payload: Payload) -> Found:
    return Found(path=Path("run/checkpoints/step-00000004.pt"), payload=payload)


def test_a_trainers_own_checkpoint_may_be_resumed() -> None:
    config = Config()
    state = state_for(config)
    state.step = 4
    own = state.payload(config=as_dict(config), config_hash="h", rng=[{}])
    assert judge(config, state, found(own)) == (None, [])


def test_a_weights_only_checkpoint_is_refused_with_a_pointer_to_init_from() -> None:
    config = Config()
    state = state_for(config)
    weights_only = Payload(step=4, model=state.module.state_dict(), config=as_dict(config))
    problem, _ = judge(config, state, found(weights_only))
    assert problem is not None
    message, hint = problem.text, problem.hint
    assert message == (
        "checkpoint run/checkpoints/step-00000004.pt holds weights only (no optimizer, scheduler,"
        " scaler, rng state to resume)"
    )
    assert "train.init_from" in hint


def test_weights_of_another_model_are_named() -> None:
    config = Config()
    state = state_for(config)
    other = torch.nn.Linear(2, 2).state_dict()
    payload = state.payload(config=as_dict(config), config_hash="h", rng=[{}])
    problem, _ = judge(config, state, found(dataclasses.replace(payload, model=other)))
    assert problem is not None
    assert "does not fit the model" in problem.text
