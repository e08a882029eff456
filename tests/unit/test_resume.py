"""Judging a checkpoint to resume from (train/resume/start.py): what it must hold besides weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from trainbox.checkpoint.schema import Payload
from trainbox.config import Config, as_dict
from trainbox.errors import UsageError
from trainbox.train.resume.init_from import read_init_weights
from trainbox.train.resume.start import ResumePoint, check_resume_point, find
from trainbox.train.resume.state import TrainState
from trainbox.train.steps.user_code import choose


def state_for(config: Config) -> TrainState:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    return TrainState(
        config, model, user_code=choose(config), world_size=1, device=torch.device("cpu"),
        amp_dtype=None,
    )  # fmt: skip


def found(payload: Payload) -> ResumePoint:
    return ResumePoint(path=Path("run/checkpoints/step-00000004.pt"), payload=payload)


def test_a_trainers_own_checkpoint_may_be_resumed() -> None:
    config = Config()
    state = state_for(config)
    state.step = 4
    own = state.payload(config=as_dict(config), config_hash="h", rng=[{}])
    assert check_resume_point(config, state, found(own)) == (None, [])


def test_a_weights_only_checkpoint_is_refused_with_a_pointer_to_init_from() -> None:
    config = Config()
    state = state_for(config)
    weights_only = Payload(step=4, model=state.module.state_dict(), config=as_dict(config))
    problem, _ = check_resume_point(config, state, found(weights_only))
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
    problem, _ = check_resume_point(config, state, found(dataclasses.replace(payload, model=other)))
    assert problem is not None
    assert "does not fit the model" in problem.text


def test_a_newest_checkpoint_that_is_not_the_trainers_is_a_problem(tmp_path: Path) -> None:
    # It loads with weights_only, so the scan takes it; its odd step must not end in a traceback.
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    torch.save({"step": [4], "model": {}}, directory / "step-00000004.pt")
    search = find(Config(), directory)
    assert search.found is None
    assert search.problem is not None
    assert "step-00000004.pt is not a trainbox checkpoint (step is a list" in search.problem.text


def test_init_from_a_run_whose_newest_checkpoint_is_odd_is_a_usage_error(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    torch.save({"step": 4, "model": 5}, directory / "step-00000004.pt")
    with pytest.raises(UsageError, match=r"step-00000004.pt is not a trainbox checkpoint \(model"):
        read_init_weights(str(tmp_path))
