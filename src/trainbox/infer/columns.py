"""`train.predict_step`: a user's {column: per-sample values}, checked and made plain rows.

The step runs on a batch; this module checks what it returned (one value per sample in every
column, the same columns and widths as the first sample's) and turns tensors into Python
numbers, so rows.py writes them without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainbox.config import factories
from trainbox.errors import UsageError
from trainbox.train.steps.functions import Step, describe

HINT = (
    "return {column name: a tensor with one row per sample, or a list of one number or string"
    " per sample} from the predict step"
)
# Written by trainbox itself in every row.
RESERVED = "index"


@dataclass(frozen=True, kw_only=True, slots=True)
class Column:
    """One column a predict step returns."""

    # Its name, as the step returned it.
    name: str
    # Values per sample: 1 writes one value, more write NAME_0..NAME_{width-1} (a JSON list).
    width: int


# Per column, one list of plain values (int, float, bool, str) per sample.
Table = dict[str, list[list[Any]]]


def predict_step(path: str) -> Step:
    """The step named by `train.predict_step`, imported now."""
    return Step(fn=factories.resolve(path, key="train.predict_step"), name=path)


def table(step: Step, result: Any, *, count: int) -> Table:
    """What the step returned for a batch of `count` samples, as plain values per sample."""
    if not isinstance(result, Mapping) or not result:
        raise _error(step, f"{describe(result)}, not a dict of columns")
    found: Table = {}
    problems = []
    for name, value in result.items():
        if not isinstance(name, str) or not name or name == RESERVED:
            problems.append(f"column name {name!r} (a non-empty string other than {RESERVED!r})")
            continue
        rows, problem = _rows(value, count)
        if problem is not None:
            problems.append(f"column {name!r} {problem} for a batch of {count} samples")
        else:
            found[name] = rows
    if problems:
        raise _error(step, "; ".join(problems))
    return found


def schema(found: Table) -> tuple[Column, ...]:
    """The columns of a table (from the first sample): what every later batch must match."""
    return tuple(Column(name=name, width=len(rows[0])) for name, rows in found.items())


def clashes(step: Step, names: Sequence[str]) -> UsageError | None:
    """Output column names written twice (`box` of 2 values makes `box_0`, a column may too)."""
    twice = sorted({name for name in names if names.count(name) > 1})
    if not twice:
        return None
    return _error(step, f"columns that write the same CSV column name twice: {twice}")


def check_schema(step: Step, found: Table, expected: Sequence[Column]) -> None:
    """The same columns, in the same order and widths, as the first sample's (the header)."""
    got = schema(found)
    if [c.name for c in got] != [c.name for c in expected]:
        raise _error(
            step,
            f"columns {[c.name for c in got]} for one batch, {[c.name for c in expected]} for"
            " the first sample",
        )
    odd = [
        f"column {mine.name!r} with {mine.width} values per sample, {first.width} for the"
        " first sample"
        for mine, first in zip(got, expected, strict=True)
        if mine.width != first.width
    ]
    if odd:
        raise _error(step, "; ".join(odd))


def _rows(value: Any, count: int) -> tuple[list[list[Any]], str | None]:
    """One list of plain values per sample, or why `value` has not one entry per sample."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] != count:
            return [], f"is {describe(value)}, not {count} rows"
        flat = value.detach().reshape(count, -1).cpu()
        if flat.shape[1] == 0:
            return [], f"is {describe(value)}, with no values per sample"
        if flat.is_floating_point():
            flat = flat.float()  # bf16/fp16 outputs written as the built-in columns are
        elif flat.is_complex():
            return [], f"is {describe(value)}: complex numbers have no column format"
        return flat.tolist(), None
    if isinstance(value, list | tuple):
        if len(value) != count:
            return [], f"is {describe(value)}, not {count} values"
        bad = [item for item in value if not isinstance(item, bool | int | float | str)]
        if bad:
            return [], f"holds {describe(bad[0])}, not a number or string per sample"
        # A part file is checked by counting its lines: a row is one line.
        broken = [item for item in value if isinstance(item, str) and _breaks(item)]
        if broken:
            return [], f"holds {describe(broken[0])}, a string with a line break"
        return [[item] for item in value], None
    return [], f"is {describe(value)}, not a tensor or list"


def _breaks(text: str) -> bool:
    return "\n" in text or "\r" in text


def _error(step: Step, what: str) -> UsageError:
    return UsageError(f"train.predict_step {step.name} returned {what}", hint=HINT)
