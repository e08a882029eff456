"""State the user keeps beside the model (an EMA, a curriculum counter): `train.state_factory`.

The factory returns {name: object with state_dict/load_state_dict}; the trainer saves every
object in each checkpoint, restores it on resume and calls its optional `after_step(step)`
after every optimizer step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from trainbox.errors import UsageError
from trainbox.train.objective import named_values
from trainbox.train.seams import UserFn, call

HINT = (
    "return {name: object} where each object has state_dict() and load_state_dict(state),"
    " and optionally after_step(step)"
)


def build(
    factory: UserFn | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """The user's state objects, checked; {} without a factory."""
    if factory is None:
        return {}
    states = named_values(
        call(factory, model, optimizer, args={}, key="train.state_factory"),
        who=f"train.state_factory {factory.name}",
        wanted="a dict",
        fits=lambda obj: (
            callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ),
        unfit="objects without state_dict and load_state_dict",
        hint=HINT,
        allow_empty=True,
        show=lambda obj: type(obj).__name__,
    )
    # Checked on every rank before training: a checkpoint holding other types would fail
    # `weights_only` loading and look damaged, so a resume would silently start over.
    unsafe = [
        f"{name!r} at {where}: {kind}"
        for name, obj in states.items()
        for where, kind in unloadable(obj.state_dict())
    ]
    if unsafe:
        raise UsageError(
            f"train.state_factory {factory.name}: state_dict() holds values a checkpoint cannot"
            f" load back: {', '.join(unsafe[:4])}",
            hint="keep states to tensors, numbers, strings, None and lists/tuples/dicts of them",
        )
    return dict(states)


def unloadable(value: Any, where: str = "state") -> list[tuple[str, str]]:
    """(path, type) of every leaf `torch.load(weights_only=True)` would refuse."""
    if isinstance(value, torch.Tensor | int | float | bool | str | bytes | type(None)):
        return []
    if isinstance(value, torch.dtype | torch.device | torch.Size):
        return []
    if type(value) in (dict, OrderedDict):
        return [
            found
            for key, item in value.items()
            for found in [*unloadable(key, f"{where} key"), *unloadable(item, f"{where}[{key!r}]")]
        ]
    if type(value) in (list, tuple):
        return [
            found for i, item in enumerate(value) for found in unloadable(item, f"{where}[{i}]")
        ]
    return [(where, type(value).__name__)]


def state_dicts(states: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds of them."""
    return {name: obj.state_dict() for name, obj in states.items()}


def restore(states: Mapping[str, Any], saved: Mapping[str, Any] | None, *, source: str) -> None:
    """Load each object's saved state; names missing on either side are one error."""
    saved = saved or {}
    missing = sorted(set(states) - set(saved))
    extra = sorted(set(saved) - set(states))
    problems = []
    if missing:
        problems.append(f"{source} holds no train.state_factory state for {', '.join(missing)}")
    if extra:
        problems.append(f"{source} holds state for {', '.join(extra)}, which this run lacks")
    for name in sorted(set(states) & set(saved)):
        try:
            states[name].load_state_dict(saved[name])
        except (KeyError, ValueError, TypeError, RuntimeError) as err:
            reason = " ".join(str(err).split())[:200]
            problems.append(f"state {name!r} cannot be restored ({type(err).__name__}: {reason})")
    if problems:
        raise UsageError(
            problems,
            hint="resume with the train.state_factory the run was started with, or start a new"
            " run_dir",
        )


def after_step(states: Mapping[str, Any], step: int) -> None:
    """Each object's `after_step(step)`, where it has one."""
    for obj in states.values():
        hook = getattr(obj, "after_step", None)
        if hook is not None:
            hook(step)
