"""What the trainer optimises and measures: the train, eval and predict steps and their contracts.

A step is the built-in one for `train.loss` or a user's `module:function`. The trainer owns
everything around a step (backward, no_sync, clipping, the optimizer); this module calls a
step and checks what it returned, so bad user code is one line naming the function. The mixed
precision a step runs in (`train.amp`) is decided here too, for training and inference alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch
import torch.nn.functional as F

from trainbox.errors import UsageError
from trainbox.train.data.batches import sample_count, to_device
from trainbox.train.data.contract import spread

STEP_HINT = "return a 0-d floating tensor (the batch's mean loss), or (loss, {name: scalar})"
EVAL_HINT = "return {metric name: (sum over the batch's samples, count of samples)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Step:
    """A step function and the name its errors carry."""

    # Called as fn(model, batch).
    fn: Callable[[Any, Any], Any]
    # `module:function` for user code, `built-in <train.loss>` otherwise.
    name: str


LOSS_HINT = (
    "with train.loss=cross_entropy return class indices (integers) as targets and logits"
    " [B, classes] from the model; for numeric targets set train.loss=mse and return one output"
    " per target"
)


# A context that does nothing, shared: nullcontext keeps no state, so one serves every step.
NO_EFFECT = contextlib.nullcontext()

# The usual class-index dtypes for cross_entropy, found with one set lookup per step.
CLASS_INDEX_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
     torch.uint64}
)  # fmt: skip


def loss_fn(kind: str, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean loss of a batch for `train.loss`; targets that do not suit it are a UsageError."""
    if kind == "cross_entropy" and targets.dtype in CLASS_INDEX_DTYPES:
        return F.cross_entropy(outputs, targets)  # fit_problem's every-step case, without a call
    problem = fit_problem(kind, outputs, targets)
    if problem is not None:
        raise UsageError(problem, hint=LOSS_HINT)
    if kind == "cross_entropy":
        return F.cross_entropy(outputs, targets)
    return F.mse_loss(outputs.reshape(targets.shape).float(), targets.float())


def fit_problem(kind: str, outputs: torch.Tensor, targets: torch.Tensor) -> str | None:
    """Why these targets do not suit `train.loss` with these outputs, or None.

    torch accepts both mistakes below without a word and trains to nonsense: float targets are
    soft labels to cross_entropy, and mse's reshape pairs any outputs with as many targets.
    """
    if kind == "cross_entropy":
        if targets.dtype in CLASS_INDEX_DTYPES:  # every step: one set lookup
            return None
        if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
            return (
                "train.loss=cross_entropy needs integer class indices as targets, not"
                f" {_dtype(targets)} targets of shape {tuple(targets.shape)}"
            )
        return None
    rows = (outputs.shape[:1], targets.shape[:1])
    if (
        outputs.dim() == 0
        or targets.dim() == 0
        or rows[0] != rows[1]
        or (outputs.numel() != targets.numel())
    ):
        return (
            f"train.loss={kind} needs one output per target: the model returned"
            f" {tuple(outputs.shape)} for targets of shape {tuple(targets.shape)}"
        )
    return None


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def builtin_train_step(kind: str) -> Step:
    """`model(inputs)` against `targets` with `train.loss`: today's trainer, bit for bit."""

    def step(model: Any, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return loss_fn(kind, model(inputs).float(), targets)

    return Step(fn=step, name=f"built-in {kind}")


def builtin_eval_step(kind: str) -> Step:
    """Loss and accuracy (cross_entropy) or mean absolute error (mse), as (sum, count) pairs."""

    def step(model: Any, batch: Any) -> dict[str, tuple[torch.Tensor, int]]:
        inputs, targets = batch
        outputs = model(inputs).float()
        count = targets.shape[0]
        # float64 so large sets add up exactly.
        sums = {"loss": (loss_fn(kind, outputs, targets).double() * count, count)}
        if kind == "cross_entropy":
            sums["accuracy"] = ((outputs.argmax(dim=-1) == targets).sum(), count)
        else:
            error = (outputs.reshape(targets.shape) - targets.float()).abs()
            sums["mae"] = (error.reshape(count, -1).mean(dim=1).sum(), count)
        return sums

    return Step(fn=step, name=f"built-in {kind}")


def train_loss(step: Step, model: Any, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run a train step: (the loss to backpropagate, extra scalars to log)."""
    result = step.fn(model, batch)
    extras: Any = {}
    if type(result) is torch.Tensor:  # the common case, checked with the fewest calls
        if not result.shape and result.is_floating_point():
            return result, extras
        loss = result
    else:
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping):
            result, extras = result
        loss = _carried_loss(result)
    if not isinstance(loss, torch.Tensor) or loss.shape or not loss.is_floating_point():
        raise UsageError(
            f"train.step {step.name} returned {describe(loss)}, not a 0-d floating loss tensor",
            hint=STEP_HINT,
        )
    if not extras:
        return loss, {}
    bad = [name for name, value in extras.items() if not _is_scalar(value)]
    if bad or not all(isinstance(name, str) for name in extras):
        raise UsageError(
            f"train.step {step.name} returned extra values that are not named scalars:"
            f" {', '.join(f'{n!r}: {describe(extras[n])}' for n in bad) or list(extras)}",
            hint=STEP_HINT,
        )
    return loss, dict(extras)


def probe(step: Step, model: Any, dataset: Any, *, device: Any = None) -> None:
    """One small batch through a user's train step on `device` (the model's) before training,
    so a bad return is one clear line at start-up, not at step 1 on every rank."""
    from torch.utils.data import default_collate

    batch = default_collate([dataset[i] for i in spread(dataset, 8)])
    sample_count(batch)
    if device is not None:
        batch = to_device(batch, torch.device(device))
    was_training = model.training
    model.eval()  # no dropout draw, no BatchNorm update: the probe leaves no trace
    try:
        with torch.no_grad():
            train_loss(step, model, batch)
    finally:
        model.train(was_training)


def eval_sums(step: Step, model: Any, batch: Any) -> dict[str, tuple[Any, Any]]:
    """Run an eval step and check it returned {name: (sum, count)}."""
    return named_values(
        step.fn(model, batch),
        who=f"train.eval_step {step.name}",
        wanted="a dict of metrics",
        fits=lambda pair: (
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and all(_is_scalar(part) for part in pair)
        ),
        unfit="values that are not (sum, count) pairs of scalars",
        hint=EVAL_HINT,
    )


def named_values(
    result: Any,
    *,
    who: str,
    wanted: str,
    fits: Callable[[Any], bool],
    unfit: str,
    hint: str,
    allow_empty: bool = False,
    show: Callable[[Any], str] | None = None,
) -> dict[str, Any]:
    """`result` as a dict if it maps str names to values that `fits`; else one UsageError
    naming `who` and each bad entry (`show`n, by default as `describe` puts it)."""
    if not isinstance(result, Mapping) or not (result or allow_empty):
        raise UsageError(f"{who} returned {describe(result)}, not {wanted}", hint=hint)
    shown = show or describe
    bad = [
        f"{name!r}: {shown(value)}"
        for name, value in result.items()
        if not isinstance(name, str) or not fits(value)
    ]
    if bad:
        raise UsageError(f"{who} returned {unfit}: {', '.join(bad)}", hint=hint)
    return dict(result)


def _carried_loss(result: Any) -> Any:
    """A model output that carries its own loss (`.loss` or `["loss"]`, Hugging Face style)."""
    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, Mapping) and "loss" in result:
        return result["loss"]
    return getattr(result, "loss", result)


def _is_scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, Real) and not isinstance(value, bool)


def describe(value: Any) -> str:
    """What user code returned, short enough for one error line."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `train.amp` on `device` (auto: bf16 on a GPU that has it), or None."""
    if amp == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else None
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]


def autocast(
    dtype: torch.dtype | None, device: torch.device
) -> contextlib.AbstractContextManager[Any]:
    """The context a step runs in: autocast to `dtype`, or nothing when AMP is off."""
    if dtype is None:
        return NO_EFFECT
    return torch.autocast(device.type, dtype=dtype)
