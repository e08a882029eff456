"""Batches of any nesting: tuples, lists, dicts, dataclasses and NamedTuples of tensors.

The trainer moves them to the device and counts their samples; user steps take them apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import default_collate

from trainbox.errors import UsageError

HINT = (
    "every tensor in a batch must hold one row per sample along its first dimension"
    " (a per-batch value can be a 0-d tensor or a plain number)"
)


def to_device(batch: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """The same structure with every tensor on `device`; other leaves are passed through."""
    kind = type(batch)
    if kind is tuple or kind is list:
        # The common (inputs, targets) batch, without _rebuild's checks: called every step,
        # so a plain loop (a generator per call costs more than the moves on a small model).
        moved = []
        for item in batch:
            if type(item) is not torch.Tensor:
                break
            moved.append(item.to(device, non_blocking=non_blocking))
        else:
            return moved if kind is list else tuple(moved)
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    return _rebuild(batch, lambda item: to_device(item, device, non_blocking=non_blocking))


def on_device(batch: Any, device: torch.device) -> tuple[Any, int]:
    """`batch` moved to `device` (non-blocking) and its sample count: what sample_count then
    to_device give, in one pass over the usual flat (inputs, targets) (it runs every step)."""
    kind = type(batch)
    if kind is tuple or kind is list:
        count = None
        moved = []
        for item in batch:  # a loop, not a comprehension: no frame of its own per step
            if type(item) is not torch.Tensor:
                break
            shape = item.shape
            if shape:  # 0-d: a per-batch value, no sample dimension
                if count is None:
                    count = shape[0]
                elif shape[0] != count:
                    break  # the general path below names the tensors that disagree
            moved.append(item.to(device, non_blocking=True))
        else:
            if count is not None:
                return (moved if kind is list else tuple(moved)), count
    count = sample_count(batch)
    return to_device(batch, device, non_blocking=True), count


def sample_count(batch: Any) -> int:
    """The first tensor's leading dimension; every other tensor must agree (0-d ones aside)."""
    if isinstance(batch, tuple | list):
        # The common (inputs, targets) batch, counted without naming paths: called every step.
        count = _plain_count(batch)
        if count is not None:
            return count
    sized = [(path, leaf) for path, leaf in leaves(batch) if leaf.dim() > 0]
    if not sized:
        raise UsageError(
            f"a batch of type {type(batch).__name__} holds no tensor with a sample dimension",
            hint=HINT,
        )
    first_path, first = sized[0]
    count = first.shape[0]
    odd = [f"{path} has {leaf.shape[0]}" for path, leaf in sized[1:] if leaf.shape[0] != count]
    if odd:
        raise UsageError(
            f"the batch's tensors disagree on the number of samples: {first_path} has {count},"
            f" {', '.join(odd)}",
            hint=HINT,
        )
    return count


def _plain_count(batch: tuple[Any, ...] | list[Any]) -> int | None:
    """The sample count of a flat sequence of tensors that agree; None for anything else."""
    count = None
    for item in batch:
        if type(item) is not torch.Tensor:
            return None
        shape = item.shape
        if not shape:  # 0-d: a per-batch value, no sample dimension
            continue
        if count is None:
            count = shape[0]
        elif shape[0] != count:
            return None  # the general path names the tensors that disagree
    return count


def leaves(batch: Any, path: str = "batch") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in `batch` with the path that names it (`batch['tokens']`, `batch[1]`)."""
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif isinstance(batch, Mapping):
        for key, value in batch.items():
            yield from leaves(value, f"{path}[{key!r}]")
    elif _is_namedtuple(batch) or _is_dataclass_instance(batch):
        for name in _field_names(batch):
            yield from leaves(getattr(batch, name), f"{path}.{name}")
    elif isinstance(batch, list | tuple):
        for index, value in enumerate(batch):
            yield from leaves(value, f"{path}[{index}]")


def collate(samples: list[Any]) -> Any:
    """A batch of `samples`: torch's default_collate, which also stacks dataclass samples.

    default_collate refuses dataclasses; they are collated field by field, at any depth. Samples
    without one go to default_collate untouched, so today's batches stay exactly as they were.
    """
    first = samples[0]
    if not _holds_dataclass(first):
        return default_collate(samples)
    if _is_dataclass_instance(first):
        fields = [f.name for f in dataclasses.fields(first) if f.init]
        changes = {name: collate([getattr(sample, name) for sample in samples]) for name in fields}
        return dataclasses.replace(first, **changes)
    if isinstance(first, Mapping):
        items = {key: collate([sample[key] for sample in samples]) for key in first}
        return _same_mapping(first, items)
    columns = [collate(list(column)) for column in zip(*samples, strict=True)]
    # NamedTuples keep their type; other sequences become lists, as default_collate makes them.
    return type(first)(*columns) if _is_namedtuple(first) else columns


def _holds_dataclass(value: Any) -> bool:
    if _is_dataclass_instance(value):
        return True
    if isinstance(value, Mapping):
        return any(_holds_dataclass(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_dataclass(item) for item in value)
    return False


def _same_mapping(original: Mapping[Any, Any], items: dict[Any, Any]) -> Mapping[Any, Any]:
    # The mapping's own type (an OrderedDict, a BatchEncoding-like dict) is kept when it can be.
    make: Callable[..., Mapping[Any, Any]] = type(original)
    try:
        return make(items)
    except TypeError:
        return items


def _rebuild(batch: Any, convert: Callable[[Any], Any]) -> Any:
    if isinstance(batch, Mapping):
        return _same_mapping(batch, {key: convert(value) for key, value in batch.items()})
    if _is_namedtuple(batch):
        return type(batch)(*(convert(value) for value in batch))
    if _is_dataclass_instance(batch):
        changes = {
            f.name: convert(getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.init
        }
        return dataclasses.replace(batch, **changes)
    if isinstance(batch, list | tuple):
        return type(batch)(convert(value) for value in batch)
    return batch


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _field_names(value: Any) -> tuple[str, ...]:
    if _is_namedtuple(value):
        return tuple(type(value)._fields)
    return tuple(f.name for f in dataclasses.fields(value))
