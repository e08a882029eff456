"""The code a user brings to the trainer: `module:function` config keys or Trainer keywords.

Each seam is resolved once, before training, into a UserFn that carries the name its errors
and run.json use, so every later complaint about what user code returned names the function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainbox.config import Config, factories
from trainbox.config.factories import resolve
from trainbox.errors import UsageError
from trainbox.train.steps.functions import Step, builtin_train_step, describe


@dataclass(frozen=True, kw_only=True, slots=True)
class UserFn:
    """A user's callable and the name that identifies it."""

    # The callable itself.
    fn: Callable[..., Any]
    # `module:function` as given in config, or the object's module and qualified name.
    name: str


@dataclass(frozen=True, kw_only=True, slots=True)
class UserCode:
    """What the loop calls instead of its built-in parts; None keeps the built-in one."""

    # The train step (the built-in one for `train.loss` when none is given).
    step: Step
    # optim.factory: (model, **optim.args) -> Optimizer.
    optimizer: UserFn | None = None
    # optim.schedule_factory: (optimizer, max_steps, **optim.schedule_args) -> LRScheduler.
    schedule: UserFn | None = None
    # train.state_factory: (model, optimizer) -> {name: object with state_dict/load_state_dict}.
    state: UserFn | None = None
    # Whether `step` is the user's (the built-in one is checked against the data differently).
    user_step: bool = False
    # train.fsdp_units: (model) -> [submodule, ...], fsdp's sharded units; None: repeated blocks.
    units: UserFn | None = None

    def describe(self) -> dict[str, str]:
        """Which code ran at each seam, for run.json."""
        units = {"train.fsdp_units": self.units.name} if self.units else {}
        return {
            "train.step": self.step.name,
            "optim.factory": self.optimizer.name if self.optimizer else "built-in",
            "optim.schedule_factory": self.schedule.name if self.schedule else "built-in",
            "train.state_factory": self.state.name if self.state else "none",
        } | units


def choose(
    config: Config,
    *,
    step: Callable[..., Any] | None = None,
    optim_factory: Callable[..., Any] | None = None,
    schedule_factory: Callable[..., Any] | None = None,
    state_factory: Callable[..., Any] | None = None,
) -> UserCode:
    """The user code from keyword objects (a script's) or else from the config's keys."""
    chosen = {
        "train.step": _pick(step, config.train.step, "step", "train.step"),
        "optim.factory": _pick(
            optim_factory, config.optim.factory, "optim_factory", "optim.factory"
        ),
        "optim.schedule_factory": _pick(
            schedule_factory,
            config.optim.schedule_factory,
            "schedule_factory",
            "optim.schedule_factory",
        ),
        "train.state_factory": _pick(
            state_factory, config.train.state_factory, "state_factory", "train.state_factory"
        ),
    }
    user_step = chosen["train.step"]
    return UserCode(
        step=Step(fn=user_step.fn, name=user_step.name)
        if user_step
        else builtin_train_step(config.train.loss),
        optimizer=chosen["optim.factory"],
        schedule=chosen["optim.schedule_factory"],
        state=chosen["train.state_factory"],
        user_step=user_step is not None,
        units=_pick(None, config.train.fsdp_units, "", "train.fsdp_units"),
    )


def call(user: UserFn, *positional: Any, args: Mapping[str, Any], key: str) -> Any:
    """`user.fn(*positional, **args)`, with arguments that do not fit as one clear error."""
    return factories.call(
        user.fn,
        *positional,
        args=args,
        culprit=f"{key} {user.name}",
        hint=f"match the function's parameters to the documented signature and {key}'s args",
    )


def _pick(given: Callable[..., Any] | None, path: str, keyword: str, key: str) -> UserFn | None:
    # A keyword object wins over the config key: a script's own code is what it means to run.
    if given is not None:
        if not callable(given):
            raise UsageError(
                f"Trainer({keyword}=...) got {describe(given)}, not a callable",
                hint="pass the function itself",
            )
        name = f"{getattr(given, '__module__', '?')}:{getattr(given, '__qualname__', repr(given))}"
        return UserFn(fn=given, name=name)
    if not path:
        return None
    return UserFn(fn=resolve(path, key=key), name=path)
