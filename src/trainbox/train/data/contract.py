"""The data contract: what a data factory returns (Datasets), the checks that it is usable,
and the one-batch probe that the model fits the data."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainbox.config.factories import call_factory, resolve
from trainbox.errors import UsageError


@dataclass(frozen=True, kw_only=True, slots=True)
class Datasets:
    """What a data factory returns: map-style datasets whose items are (inputs, target) pairs."""

    # Training samples; each rank reads its DistributedSampler shard.
    train: Any
    # Validation samples, evaluated sharded over all ranks; None skips evaluation.
    val: Any = None
    # Most DataLoader workers worth using; 0 for in-memory tensors, where workers only copy.
    max_workers: int | None = None


PAIR_HINT = (
    "return (inputs, target) from the dataset's __getitem__ (tensors, numbers or NumPy arrays"
    " that stack into a batch; the model is called as model(inputs)), or set train.step to a"
    " function (model, batch) -> loss that takes your batches apart (docs/your-model.md)"
)


def build_data(path: str, args: Mapping[str, Any]) -> Datasets:
    """Call the data factory; accept Datasets or a (train, val) pair, and check both are usable."""
    result = call_factory(resolve(path, key="data.factory"), args, key="data.factory", path=path)
    origin = f"data.factory={path!r} returned"
    return as_datasets(result, origin=origin, check_hint=f"check what {path} returns")


def as_datasets(value: Any, *, origin: str, check_hint: str) -> Datasets:
    """`value` as Datasets: Datasets itself or a (train, val) pair, each usable; else UsageError.

    `origin` starts the error (`data.factory='m:f' returned`); `check_hint` is an empty or
    unsized dataset's hint.
    """
    if isinstance(value, tuple | list) and len(value) == 2:
        value = Datasets(train=value[0], val=value[1])
    if not isinstance(value, Datasets):
        kind = type(value).__name__
        shown = f"a {kind} of {len(value)}" if isinstance(value, tuple | list) else kind
        raise UsageError(
            f"{origin} {shown}",
            hint="return trainbox.Datasets(train=..., val=...) or a (train, val) tuple",
        )
    problems = [
        problem
        for name, dataset in (("train", value.train), ("val", value.val))
        if (problem := _dataset_problem(name, dataset, optional=name == "val")) is not None
    ]
    if problems:
        streams = any(ITERABLE in problem for problem in problems)
        raise UsageError(problems, hint=STREAM_HINT if streams else check_hint)
    return value


def spread(dataset: Any, count: int) -> list[int]:
    """About `count` indices spread evenly over `dataset`, for a start-up check to read; its
    first `count` where the dataset's `probe_front` is true (a stream read over a network)."""
    size = len(dataset)
    if getattr(dataset, "probe_front", False):
        return list(range(min(count, size)))
    return list(range(0, size, max(1, size // count)))


def check_fit(
    model: Any, datasets: Datasets, *, loss: Callable[[Any, Any], Any], device: Any = None
) -> None:
    """Run one tiny batch through the model and the loss (on `device`, the model's), so a
    mismatch is one clear line."""
    import torch
    from torch.utils.data import default_collate

    # 64 samples spread over the set: likely to include the largest class index.
    items = [datasets.train[i] for i in spread(datasets.train, 64)]
    try:
        batch = default_collate(items)
    except (TypeError, RuntimeError) as err:
        raise UsageError(
            f"the train dataset's items ({_describe(items[0])}) cannot be stacked into a batch"
            f" ({type(err).__name__}: {_first_line(err)})",
            hint=PAIR_HINT,
        ) from err
    if not (
        isinstance(batch, tuple | list)
        and len(batch) == 2
        and all(isinstance(part, torch.Tensor) for part in batch)
    ):
        # Samples of another shape are fine, but the built-in step cannot take them apart.
        size_of = f" of {len(batch)}" if isinstance(batch, tuple | list | dict) else ""
        raise UsageError(
            "the built-in train step needs (inputs, target) samples; the train dataset's items"
            f" are {_describe(items[0])}, not (inputs, target) pairs of tensors (they collate"
            f" to a {type(batch).__name__}{size_of})",
            hint=PAIR_HINT,
        )
    inputs, targets = batch
    if device is not None:
        inputs, targets = inputs.to(device), targets.to(device)
    was_training = model.training
    model.eval()  # no dropout draw, no BatchNorm update: the probe leaves no trace
    try:
        with torch.no_grad():
            loss(model(inputs), targets)
    except (RuntimeError, IndexError, ValueError, TypeError) as err:
        raise UsageError(
            f"the model does not fit the data: a batch of inputs {tuple(inputs.shape)} and"
            f" targets {tuple(targets.shape)} fails ({type(err).__name__}: {err})".replace(
                "\n", " "
            ),
            hint="match model.args (input size, number of classes) to the data, and train.loss"
            " to the targets (class indices: cross_entropy; numbers: mse)",
        ) from err
    finally:
        model.train(was_training)


def _is_iterable_dataset(dataset: Any) -> bool:
    """torch's IterableDataset anywhere in its classes (torch itself need not be imported)."""
    return any(
        cls.__name__ == "IterableDataset" and cls.__module__.startswith("torch.utils.data")
        for cls in type(dataset).__mro__
    )


def _describe(item: Any) -> str:
    """An item's kind as an error names it: `dict`, `str`, `a tuple of (Tensor, str)`."""
    if isinstance(item, tuple | list):
        kind = type(item).__name__
        if len(item) != 2:
            return f"a {kind} of {len(item)}"
        return f"a {kind} of ({', '.join(type(part).__name__ for part in item)})"
    return type(item).__name__


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


ITERABLE = "is an IterableDataset"
STREAM_HINT = (
    "return a map-style dataset (__len__ and __getitem__), which trainbox shards over ranks and"
    " workers with a resumable position; for tar shards use data.factory="
    "trainbox.tasks.shards:data (see docs/streamed-data.md)"
)


def _dataset_problem(name: str, dataset: Any, *, optional: bool) -> str | None:
    if dataset is None:
        return None if optional else f"the {name} dataset is None"
    if _is_iterable_dataset(dataset):
        # The DataLoader copies it into every worker and every rank builds it whole: each
        # would yield all of it, and the epoch's length and position would be the user's guess.
        return (
            f"the {name} dataset ({type(dataset).__name__}) {ITERABLE}: every rank and"
            " DataLoader worker would read all of it, with no position to resume from"
        )
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return f"the {name} dataset ({type(dataset).__name__}) is not a sized map-style dataset"
    if len(dataset) == 0:
        return f"the {name} dataset is empty"
    return None
