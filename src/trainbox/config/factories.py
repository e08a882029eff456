"""User code plugs in as `module:function` factories; this module imports and checks them."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from trainbox.errors import UsageError

# config.yaml's model.factory / data.factory of a run whose model or data the Python API passed
# as objects: no factory rebuilds them, so eval and predict must be told one.
API_SUPPLIED = "<api>"


def resolve(path: str, *, key: str) -> Callable[..., Any]:
    """The callable named by `package.module:function`; a clear UsageError if it cannot be had."""
    module_name, _, attr = path.partition(":")
    _search_working_directory(sys.path)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # any import-time failure of user code is the user's to see
        raise UsageError(
            f"{key}={path!r}: importing {module_name!r} failed ({type(err).__name__}: {err})",
            hint="pip install the package into the image, or mount it and add it to PYTHONPATH",
        ) from err
    factory: object = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(
            f"{key}={path!r}: module {module_name!r} has no callable {attr!r}",
            hint=f"check the function name after the colon in {key}",
        )
    return factory


def _search_working_directory(search_path: list[str]) -> None:
    """Let user code in the working directory import, as `python -m trainbox` already does.

    The `trainbox` console script starts with its bin directory as sys.path[0], not the working
    directory. Appended last, so an installed package of the same name wins over a stray file.
    """
    here = os.getcwd()
    if here not in search_path and "" not in search_path:
        search_path.append(here)


def build_model(path: str, args: Mapping[str, Any]) -> Any:
    """Call the model factory and check that it returned a torch.nn.Module."""
    import torch

    model = call_factory(resolve(path, key="model.factory"), args, key="model.factory", path=path)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"model.factory={path!r} returned {type(model).__name__}, not a torch.nn.Module",
            hint="the model factory must return the module to train",
        )
    return model


def call(
    fn: Callable[..., Any], *positional: Any, args: Mapping[str, Any], culprit: str, hint: str
) -> Any:
    """`fn(*positional, **args)`, with arguments that do not fit as one error naming `culprit`.

    The signature is checked first, so a TypeError raised inside user code (a bug there)
    keeps its traceback instead of passing for bad arguments.
    """
    try:
        inspect.signature(fn).bind(*positional, **args)
    except TypeError as err:
        raise UsageError(f"{culprit} does not accept these arguments ({err})", hint=hint) from err
    except ValueError:
        pass  # no introspectable signature (some builtins): just call it
    return fn(*positional, **args)


def call_factory(
    factory: Callable[..., Any], args: Mapping[str, Any], *, key: str, path: str
) -> Any:
    """`factory(**args)` for config key `key` (`model.factory`), its misfit arguments one error."""
    section = key.split(".")[0]
    hint = f"match {section}.args to the factory's parameters"
    return call(factory, args=args, culprit=f"{key}={path!r}", hint=hint)
