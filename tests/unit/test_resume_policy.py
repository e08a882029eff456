"""What a resumed run may change without consent: one table, every config key decided."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from trainbox import config
from trainbox.train.resume import policy
from trainbox.train.resume.policy import judge_resume, rule_for


def resolved(*overrides: str) -> dict[str, Any]:
    return config.as_dict(config.load(None, list(overrides)))


FREE = [
    "train.max_steps=9000", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=5",
    "train.keep_last=9", "train.async_save=true", "train.resume=never", "dist.timeout_s=30",
    "dist.backend=gloo", "pinning.num_workers=0", "preflight.gpus=off", "run_dir=/elsewhere",
    "train.compile=true", "train.deterministic=true", "train.resume_changes=allow",
]  # fmt: skip


@pytest.mark.parametrize("override", FREE)
def test_changes_that_leave_the_state_meaningful_are_accepted(override: str) -> None:
    assert judge_resume(resolved(), resolved(override)) == []


REFUSED = [
    ("optim.lr=0.01", "optim.lr: 0.003 -> 0.01"),
    ("optim.name=sgd", "optim.name: 'adamw' -> 'sgd'"),
    ("optim.schedule=constant", "optim.schedule: 'cosine' -> 'constant'"),
    ("train.amp=fp16", "train.amp: 'auto' -> 'fp16'"),
    ("train.batch_size=32", "train.batch_size: 64 -> 32"),
    ("train.grad_accum=2", "train.grad_accum: 1 -> 2"),
    ("train.loss=mse", "train.loss: 'cross_entropy' -> 'mse'"),
    ("seed=3", "seed: 0 -> 3"),
    ("model.args.hidden=32", "model.args.hidden: (unset) -> 32"),
    ("model.factory=pkg.mod:net", "model.factory: 'trainbox.tasks.spirals:model' -> 'pkg.mod:net'"),
    ("data.args.noise=0.5", "data.args.noise: (unset) -> 0.5"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "diff"), REFUSED)
def test_changes_the_checkpoint_was_not_made_for_are_named_with_both_values(
    override: str, diff: str
) -> None:
    assert judge_resume(resolved(), resolved(override)) == [diff]


def test_every_problem_is_reported_at_once() -> None:
    problems = judge_resume(resolved(), resolved("optim.lr=0.01", "seed=2", "train.max_steps=5"))
    assert problems == ["optim.lr: 0.003 -> 0.01", "seed: 0 -> 2"]


def test_a_model_argument_that_was_dropped_counts() -> None:
    old = resolved("model.args.hidden=32")
    assert judge_resume(old, resolved()) == ["model.args.hidden: 32 -> (unset)"]


def _leaves(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for spec in dataclasses.fields(cls):
        kind = spec.default_factory() if callable(spec.default_factory) else spec.default
        if dataclasses.is_dataclass(kind):
            keys += _leaves(type(kind), f"{prefix}{spec.name}.")
        else:
            keys.append(f"{prefix}{spec.name}")
    return keys


@pytest.mark.parametrize("key", _leaves(config.Config))
def test_every_config_key_has_a_decided_rule(key: str) -> None:
    named = [
        name
        for name in (*policy.MAY_CHANGE, *policy.NEEDS_CONSENT)
        if key == name or (name.endswith(".") and key.startswith(name))
    ]
    assert named, f"decide in train/resume/policy.py whether {key} may change on resume"
    assert rule_for(key)[1]


def test_an_unknown_key_needs_consent() -> None:
    assert rule_for("train.some_future_key")[0] is False
