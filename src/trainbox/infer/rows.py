"""Prediction rows as text: fixed float formatting, so equal predictions give equal bytes.

Pure: plain numbers in, bytes out (no torch).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

# Significant digits of every float written: float32 carries about 7, the 7th is noise between
# kernels; 6 keep the bytes stable and the values faithful.
DIGITS = 6


def number(value: float, *, fmt: str) -> str:
    """`value` with DIGITS significant digits; JSON has no NaN or infinity, so those are null."""
    if not math.isfinite(value) and fmt == "jsonl":
        return "null"
    return format(value, f".{DIGITS}g")


def columns(kind: str, width: int, *, target_width: int = 0) -> list[str]:
    """Column names: index, predicted, the data's target (when it has one), then one
    probability per class (classification)."""
    target = _names("target", target_width)
    if kind == "cross_entropy":
        return ["index", "predicted", *target, *(f"prob_{k}" for k in range(width))]
    return ["index", *_names("predicted", width), *target]


def _names(name: str, width: int) -> list[str]:
    """NAME for one value per row, NAME_0..NAME_{width-1} for more, none for 0."""
    return [name] if width == 1 else [f"{name}_{k}" for k in range(width)]


def header(fmt: str, kind: str, width: int, *, target_width: int = 0) -> bytes:
    """The first line of a CSV file; JSONL has none."""
    if fmt != "csv":
        return b""
    return (",".join(columns(kind, width, target_width=target_width)) + "\n").encode()


def render(
    fmt: str,
    *,
    indices: Sequence[int],
    values: Sequence[Sequence[float]],
    classes: Sequence[int] | None = None,
    targets: Sequence[Sequence[Any]] | None = None,
) -> bytes:
    """One line per input: index, then class and probabilities (`classes` given) or values,
    with the data's own target after the prediction (`targets` given)."""
    lines = []
    for row, index in enumerate(indices):
        numbers = [number(v, fmt=fmt) for v in values[row]]
        truth = [] if targets is None else [_text(v, fmt=fmt) for v in targets[row]]
        predicted = None if classes is None else classes[row]
        if fmt == "csv":
            shown = [*numbers, *truth] if predicted is None else [str(predicted), *truth, *numbers]
            lines.append(",".join([str(index), *shown]))
        else:
            lines.append(_json_row(index, numbers, truth, predicted))
    return "".join(line + "\n" for line in lines).encode()


def _json_row(index: int, numbers: list[str], truth: list[str], predicted: int | None) -> str:
    """One JSONL object: a class with its probabilities, or the predicted values; then the
    target when there is one, as one value or a list like the prediction."""
    target = "" if not truth else f',"target":{_one_or_list(truth)}'
    if predicted is not None:
        return (
            f'{{"index":{index},"predicted":{predicted}{target},'
            f'"probabilities":[{",".join(numbers)}]}}'
        )
    return f'{{"index":{index},"predicted":{_one_or_list(numbers)}{target}}}'


def _one_or_list(texts: list[str]) -> str:
    return texts[0] if len(texts) == 1 else f"[{','.join(texts)}]"


def step_columns(widths: Mapping[str, int]) -> list[str]:
    """Column names for a user's predict step: index, then NAME or NAME_0..NAME_{width-1}."""
    names = ["index"]
    for name, width in widths.items():
        names += [name] if width == 1 else [f"{name}_{k}" for k in range(width)]
    return names


def step_header(fmt: str, widths: Mapping[str, int]) -> bytes:
    """The first line of a CSV file of a user's columns; JSONL has none."""
    return _csv_line(step_columns(widths)) if fmt == "csv" else b""


def render_table(
    fmt: str, *, indices: Sequence[int], table: Mapping[str, Sequence[Sequence[Any]]]
) -> bytes:
    """One line per input from a user's columns: per sample, each column's plain values.

    CSV: one field per value, quoted as the csv module does when a string needs it. JSONL: a
    column of one value per sample is that value, a wider one a list.
    """
    lines = []
    for row, index in enumerate(indices):
        if fmt == "csv":
            fields = [str(index)]
            for values in table.values():
                fields += [_text(v, fmt=fmt) for v in values[row]]
            lines.append(_csv_line(fields))
            continue
        items = [f'"index":{index}']
        for name, values in table.items():
            texts = [_text(v, fmt=fmt) for v in values[row]]
            shown = texts[0] if len(texts) == 1 else f"[{','.join(texts)}]"
            items.append(f"{json.dumps(name)}:{shown}")
        lines.append(("{" + ",".join(items) + "}\n").encode())
    return b"".join(lines)


def _text(value: Any, *, fmt: str) -> str:
    """A plain value as its CSV field or JSON literal (floats: `number`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return number(value, fmt=fmt)
    return json.dumps(value) if fmt == "jsonl" else str(value)


def _csv_line(fields: Sequence[str]) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(fields)
    return buffer.getvalue().encode()
