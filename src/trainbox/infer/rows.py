"""Prediction rows as text: fixed float formatting, so equal predictions give equal bytes.

Pure: plain numbers in, bytes out (no torch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
