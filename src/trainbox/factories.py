"""User code plugs in as `module:function` factories; this module imports and checks them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainbox.errors import UsageError


@dataclass(frozen=True, kw_only=True, slots=True)
class Datasets:
    """What a data factory returns: map-style datasets whose items are (inputs, target) pairs."""

    # Training samples; each rank reads its DistributedSampler shard.
    train: Any
    # Validation samples, evaluated sharded over all ranks; None skips evaluation.
    val: Any = None


def resolve(path: str, *, key: str) -> Callable[..., Any]:
    """The callable named by `package.module:function`; a clear UsageError if it cannot be had."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # any import-time failure of user code is the user's to see
        raise UsageError(
            f"{key}={path!r}: importing {module_name!r} failed ({type(err).__name__}: {err})",
            hint="pip install the package into the image, or mount it and add it to PYTHONPATH",
        ) from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(
            f"{key}={path!r}: module {module_name!r} has no callable {attr!r}",
            hint=f"check the function name after the colon in {key}",
        )
    return factory


def build_model(path: str, args: Mapping[str, Any]) -> Any:
    """Call the model factory and check that it returned a torch.nn.Module."""
    import torch

    model = _call(resolve(path, key="model.factory"), args, key="model.factory", path=path)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"model.factory={path!r} returned {type(model).__name__}, not a torch.nn.Module",
            hint="the model factory must return the module to train",
        )
    return model


def build_data(path: str, args: Mapping[str, Any]) -> Datasets:
    """Call the data factory; accept Datasets or a (train, val) pair, and check both are usable."""
    result = _call(resolve(path, key="data.factory"), args, key="data.factory", path=path)
    if isinstance(result, tuple | list) and len(result) == 2:
        result = Datasets(train=result[0], val=result[1])
    if not isinstance(result, Datasets):
        raise UsageError(
            f"data.factory={path!r} returned {type(result).__name__}",
            hint="return trainbox.factories.Datasets(train=..., val=...) or a (train, val) tuple",
        )
    problems = [
        problem
        for name, dataset in (("train", result.train), ("val", result.val))
        if (problem := _dataset_problem(name, dataset, optional=name == "val")) is not None
    ]
    if problems:
        raise UsageError(problems, hint=f"check what {path} returns")
    return result


def _call(factory: Callable[..., Any], args: Mapping[str, Any], *, key: str, path: str) -> Any:
    try:
        return factory(**args)
    except TypeError as err:
        raise UsageError(
            f"{key}={path!r} does not accept these arguments ({err})",
            hint=f"match {key.split('.')[0]}.args to the factory's parameters",
        ) from err


def _dataset_problem(name: str, dataset: Any, *, optional: bool) -> str | None:
    if dataset is None:
        return None if optional else f"the {name} dataset is None"
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return f"the {name} dataset ({type(dataset).__name__}) is not a sized map-style dataset"
    if len(dataset) == 0:
        return f"the {name} dataset is empty"
    return None
