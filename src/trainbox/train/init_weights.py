"""`train.init_from`: a new run starts from another run's weights (fine-tuning, a warm start).

Only the weights: step 0, a fresh optimizer and schedule. The checkpoint is read and checked as
a resume reads it (checksum, weights_only); tensors that do not fit are named in one error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainbox.checkpoint import schema
from trainbox.errors import UsageError

HINT = (
    "point train.init_from at a run_dir or checkpoint of a matching model; use"
    " train.init_prefix to take a submodule's tensors, train.init_strict=false to allow gaps"
)


def read(source: str) -> tuple[Path, Mapping[str, Any]]:
    """The checkpoint `source` names (a run_dir: its newest valid one) and its model weights."""
    path = Path(source)
    if path.is_dir():
        found = schema.newest(path / "checkpoints" if (path / "checkpoints").is_dir() else path)
        if found is None:
            raise UsageError(f"train.init_from={source!r} holds no valid checkpoint", hint=HINT)
        return found[0], found[1].model
    try:
        return path, schema.load(path).model
    except (OSError, ValueError) as err:
        raise UsageError(f"train.init_from={source!r}: {err}", hint=HINT) from err


def select(weights: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The tensors under `prefix` (a dotted module path), with the prefix stripped."""
    if not prefix:
        return dict(weights)
    head = prefix if prefix.endswith(".") else f"{prefix}."
    return {key[len(head) :]: value for key, value in weights.items() if key.startswith(head)}


def apply(module: torch.nn.Module, *, source: str, prefix: str, strict: bool) -> Path:
    """Load the selected weights into `module` (on every rank alike); the checkpoint used."""
    path, weights = read(source)
    chosen = select(weights, prefix)
    found = schema.misfits(module.state_dict(), chosen, strict=strict)
    if found:
        where = f"{path}" + (f" under prefix {prefix!r}" if prefix else "")
        raise UsageError([f"train.init_from {where} does not fit the model", *found], hint=HINT)
    module.load_state_dict(chosen, strict=strict)
    return path
