"""User code at the named user_code (issue 14): choosing it, and checking what it returns."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from trainbox.checkpoint import files as checkpoint
from trainbox.config import load
from trainbox.errors import UsageError
from trainbox.train.resume import init_from, state
from trainbox.train.steps import optim
from trainbox.train.steps.user_code import UserFn, choose


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def my_step(model: Any, batch: Any) -> torch.Tensor:
    return model(batch).sum()


def test_defaults_are_the_built_in_parts() -> None:
    user_code = choose(load(None, []))
    assert not user_code.user_step
    assert user_code.step.name == "built-in cross_entropy"
    assert user_code.describe()["optim.factory"] == "built-in"


def test_a_keyword_object_wins_over_the_config_key_and_is_named() -> None:
    config = load(None, ["train.step=no_such_module:step"])
    user_code = choose(config, step=my_step)
    assert user_code.user_step
    assert user_code.step.fn is my_step
    assert user_code.step.name == f"{__name__}:my_step"


def test_a_config_key_is_imported_and_named_as_given() -> None:
    config = load(None, ["optim.factory=torch.optim:SGD"])
    assert choose(config).optimizer == UserFn(fn=torch.optim.SGD, name="torch.optim:SGD")


def test_a_keyword_that_is_not_callable_is_an_error() -> None:
    with pytest.raises(UsageError, match=r"Trainer\(state_factory=...\) got str"):
        choose(load(None, []), state_factory="ema")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key", ["train.step", "optim.factory", "optim.schedule_factory", "train.state_factory"]
)
def test_seam_keys_are_empty_or_module_function(key: str) -> None:
    assert load(None, [f"{key}=pkg.mod:fn"])
    with pytest.raises(UsageError, match=f"{key}='nocolon' must look like package.module:function"):
        load(None, [f"{key}=nocolon"])


def groups(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    first, _, last = model
    return torch.optim.SGD(
        [{"params": first.parameters(), "lr": lr}, {"params": last.parameters()}], lr=lr * 10
    )


def test_every_param_group_gets_the_lr_scaling() -> None:
    config = load(None, ["optim.scale_lr=linear", "train.grad_accum=2", "optim.args.lr=0.01"])
    factory = UserFn(fn=groups, name="t:groups")
    optimizer = optim.build_optimizer(config, tiny(), world_size=3, factory=factory)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.06, 0.6])


def test_the_built_in_optimizer_is_todays() -> None:
    config = load(None, ["optim.scale_lr=sqrt", "optim.lr=0.5"])
    optimizer = optim.build_optimizer(config, tiny(), world_size=4, factory=None)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["lr"] == 1.0


def test_an_optimizer_factory_returning_something_else_is_named() -> None:
    factory = UserFn(fn=lambda model: [model], name="pkg:opt")
    with pytest.raises(
        UsageError, match=r"optim.factory pkg:opt returned a list of 1, not a torch.optim.Optimizer"
    ):
        optim.build_optimizer(load(None, []), tiny(), world_size=1, factory=factory)


def test_factory_arguments_that_do_not_fit_are_named() -> None:
    config = load(None, ["optim.args.momentum=0.9"])
    with pytest.raises(
        UsageError, match=re.escape("optim.factory t:groups does not accept these arguments")
    ):
        optim.build_optimizer(
            config, tiny(), world_size=1, factory=UserFn(fn=groups, name="t:groups")
        )


def test_a_schedule_factory_gets_the_optimizer_and_max_steps() -> None:
    config = load(None, ["train.max_steps=10", "optim.schedule_args.gamma=0.5"])
    seen = {}

    def factory(optimizer: torch.optim.Optimizer, max_steps: int, gamma: float) -> Any:
        seen["max_steps"] = max_steps
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=gamma)

    optimizer = optim.build_optimizer(config, tiny(), world_size=1, factory=None)
    scheduler = optim.build_scheduler(config, optimizer, factory=UserFn(fn=factory, name="p:s"))
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
    assert seen == {"max_steps": 10}


def test_a_schedule_of_another_optimizer_is_an_error() -> None:
    config = load(None, [])
    other = torch.optim.SGD(tiny().parameters(), lr=1)
    factory = UserFn(fn=lambda _o, _n: torch.optim.lr_scheduler.StepLR(other, 1), name="p:s")
    optimizer = optim.build_optimizer(config, tiny(), world_size=1, factory=None)
    with pytest.raises(
        UsageError,
        match=re.escape("optim.schedule_factory p:s returned a scheduler of another optimizer"),
    ):
        optim.build_scheduler(config, optimizer, factory=factory)


def restore_problem(optimizer: Any, scheduler: Any, *, saved_optim: Any, saved_sched: Any) -> str:
    """The one error restoring `saved_*`'s states into `optimizer` and `scheduler` raises."""
    with pytest.raises(UsageError) as caught:
        optim.restore(
            optimizer,
            scheduler,
            optimizer_state=saved_optim.state_dict(),
            scheduler_state=saved_sched.state_dict(),
            source="c.pt",
        )
    return str(caught.value)


def test_optimizer_state_that_does_not_fit_is_one_error() -> None:
    model = tiny()
    one = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(one, 1)
    found = restore_problem(one, scheduler, saved_optim=groups(model, 0.1), saved_sched=scheduler)
    assert "the optimizer state in c.pt does not fit this run's optimizer" in found


class Counter:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def state_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = list(state["steps"])

    def after_step(self, step: int) -> None:
        self.steps.append(step)


def test_extra_state_round_trips_and_hears_every_step() -> None:
    model = tiny()
    factory = UserFn(fn=lambda _m, _o: {"counter": Counter()}, name="p:state")
    states = state.build_user_state(factory, model, torch.optim.SGD(model.parameters(), lr=1))
    state.user_state_after_step(states, 1)
    state.user_state_after_step(states, 2)
    saved = state.user_state_dicts(states)
    again = state.build_user_state(factory, model, torch.optim.SGD(model.parameters(), lr=1))
    state.restore_user_state(again, saved, source="ckpt")
    assert again["counter"].steps == [1, 2]


def test_extra_state_without_state_dict_is_named() -> None:
    factory = UserFn(fn=lambda _m, _o: {"ema": object()}, name="p:state")
    with pytest.raises(
        UsageError,
        match=re.escape("p:state returned objects without state_dict and load_state_dict: 'ema'"),
    ):
        state.build_user_state(factory, tiny(), torch.optim.SGD(tiny().parameters(), lr=1))


def test_extra_state_missing_from_a_checkpoint_is_an_error() -> None:
    with pytest.raises(
        UsageError, match=re.escape("ckpt holds no train.state_factory state for counter")
    ):
        state.restore_user_state({"counter": Counter()}, {}, source="ckpt")


def test_init_prefix_keeps_and_strips_only_its_keys() -> None:
    weights = {"backbone.w": torch.zeros(1), "backbone.b": torch.ones(1), "head.w": torch.zeros(2)}
    assert init_from.select_weights(weights, "backbone") == {
        "w": weights["backbone.w"],
        "b": weights["backbone.b"],
    }
    assert init_from.select_weights(weights, "") == weights


class Opaque:
    def state_dict(self) -> dict[str, Any]:
        return {"ok": [torch.zeros(1), 3, "x"], "bad": Counter()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


def test_state_a_checkpoint_cannot_load_back_is_refused_at_start() -> None:
    factory = UserFn(fn=lambda _m, _o: {"opaque": Opaque()}, name="p:state")
    model = tiny()
    with pytest.raises(UsageError, match=re.escape("'opaque' at state['bad']: Counter")):
        state.build_user_state(factory, model, torch.optim.SGD(model.parameters(), lr=1))


class Unrestorable(torch.optim.lr_scheduler.StepLR):
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        del state_dict
        raise ValueError("made for another run")


def test_a_scheduler_that_cannot_be_restored_is_one_error() -> None:
    optimizer = torch.optim.SGD(tiny().parameters(), lr=0.1)
    scheduler = Unrestorable(optimizer, 1)
    found = restore_problem(optimizer, scheduler, saved_optim=optimizer, saved_sched=scheduler)
    assert (
        "the scheduler state in c.pt does not fit this run's scheduler (Unrestorable):"
        " ValueError: made for another run" in found
    )


def test_init_from_reads_a_checkpoint_file_or_a_run_dir(tmp_path: Path) -> None:
    weights = tiny().state_dict()
    saved = checkpoint.save(tmp_path / "run" / "checkpoints", 5, {"step": 5, "model": weights})
    for source in (saved, tmp_path / "run"):
        path, read = init_from.read_init_weights(str(source))
        assert path == saved
        assert all(torch.equal(read[key], weights[key]) for key in weights)
    with pytest.raises(UsageError, match="holds no valid checkpoint"):
        init_from.read_init_weights(str(tmp_path))


def test_init_from_loads_the_weights_or_names_what_does_not_fit(tmp_path: Path) -> None:
    source = tiny()
    with torch.no_grad():
        source[0].weight.fill_(0.5)
    saved = checkpoint.save(tmp_path, 1, {"step": 1, "model": source.state_dict()})
    target = tiny()
    assert init_from.init_weights(target, source=str(saved), prefix="", strict=True) == saved
    assert torch.equal(target[0].weight, source[0].weight)
    with pytest.raises(
        UsageError,
        match=r"under prefix '0' does not fit the model; missing from the checkpoint: 0.weight",
    ):
        init_from.init_weights(tiny(), source=str(saved), prefix="0", strict=True)


def test_another_kind_of_schedule_is_not_merged_in_silently() -> None:
    optimizer = torch.optim.SGD(tiny().parameters(), lr=0.1)
    built_in = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: 1.0)
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=10)
    found = restore_problem(optimizer, one_cycle, saved_optim=optimizer, saved_sched=built_in)
    assert "is another kind of schedule than this run's OneCycleLR (it has lr_lambdas)" in found
