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


def columns(kind: str, width: int) -> list[str]:
    """Column names: index, predicted, then one probability per class (classification)."""
    if kind == "cross_entropy":
        return ["index", "predicted", *(f"prob_{k}" for k in range(width))]
    if width == 1:
        return ["index", "predicted"]
    return ["index", *(f"predicted_{k}" for k in range(width))]


def header(fmt: str, kind: str, width: int) -> bytes:
    """The first line of a CSV file; JSONL has none."""
    return (",".join(columns(kind, width)) + "\n").encode() if fmt == "csv" else b""


def render(
    fmt: str,
    *,
    indices: Sequence[int],
    values: Sequence[Sequence[float]],
    classes: Sequence[int] | None = None,
) -> bytes:
    """One line per input: index, then class and probabilities (`classes` given) or values."""
    lines = []
    for row, index in enumerate(indices):
        numbers = [number(v, fmt=fmt) for v in values[row]]
        if fmt == "csv":
            head = [str(index), str(classes[row])] if classes is not None else [str(index)]
            lines.append(",".join([*head, *numbers]))
        elif classes is not None:
            lines.append(
                f'{{"index":{index},"predicted":{classes[row]},'
                f'"probabilities":[{",".join(numbers)}]}}'
            )
        else:
            predicted = numbers[0] if len(numbers) == 1 else f"[{','.join(numbers)}]"
            lines.append(f'{{"index":{index},"predicted":{predicted}}}')
    return "".join(line + "\n" for line in lines).encode()


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
