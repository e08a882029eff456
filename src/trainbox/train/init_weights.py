"""`train.init_from`: a new run starts from another run's weights (fine-tuning, a warm start).

Only the weights: step 0, a fresh optimizer and schedule. The checkpoint is read and checked as
a resume reads it (checksum, weights_only); tensors that do not fit are named in one error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from trainbox.errors import UsageError
from trainbox.train import checkpoint

HINT = (
    "point train.init_from at a run_dir or checkpoint of a matching model; use"
    " train.init_prefix to take a submodule's tensors, train.init_strict=false to allow gaps"
)


def read(source: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """The checkpoint `source` names (a run_dir: its newest valid one) and its model weights."""
    path = Path(source)
    if path.is_dir():
        found = checkpoint.newest_valid(
            path / "checkpoints" if (path / "checkpoints").is_dir() else path
        )
        if found is None:
            raise UsageError(f"train.init_from={source!r} holds no valid checkpoint", hint=HINT)
        return found[0], found[1]["model"]
    try:
        return path, checkpoint.load(path)["model"]
    except (OSError, ValueError) as err:
        raise UsageError(f"train.init_from={source!r}: {err}", hint=HINT) from err


def select(weights: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix` (a dotted module path), with the prefix stripped."""
    if not prefix:
        return dict(weights)
    head = prefix if prefix.endswith(".") else f"{prefix}."
    return {key[len(head) :]: value for key, value in weights.items() if key.startswith(head)}


def problems(
    model: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor], *, strict: bool
) -> list[str]:
    """Why `weights` cannot be loaded into a model with state `model` (none when they can)."""
    found = []
    shapes = [
        f"{key} {tuple(value.shape)} vs the model's {tuple(model[key].shape)}"
        for key, value in weights.items()
        if key in model and value.shape != model[key].shape
    ]
    if shapes:
        found.append(f"shapes differ: {_few(shapes)}")
    if strict:
        missing = [key for key in model if key not in weights]
        unexpected = [key for key in weights if key not in model]
        if missing:
            found.append(f"missing from the checkpoint: {_few(missing)}")
        if unexpected:
            found.append(f"not in the model: {_few(unexpected)}")
    elif not any(key in model for key in weights):
        found.append("no tensor of the checkpoint matches the model's names")
    return found


def apply(module: torch.nn.Module, *, source: str, prefix: str, strict: bool) -> Path:
    """Load the selected weights into `module` (on every rank alike); the checkpoint used."""
    path, weights = read(source)
    chosen = select(weights, prefix)
    found = problems(module.state_dict(), chosen, strict=strict)
    if found:
        where = f"{path}" + (f" under prefix {prefix!r}" if prefix else "")
        raise UsageError([f"train.init_from {where} does not fit the model", *found], hint=HINT)
    module.load_state_dict(chosen, strict=strict)
    return path


def _few(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
