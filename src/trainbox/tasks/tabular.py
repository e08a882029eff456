"""CSV files as a data source: numeric feature columns and one class or numeric target column."""

from __future__ import annotations

import csv
import difflib
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.utils.data import Dataset

from trainbox.tasks.problems import Problems
from trainbox.train.data.contract import Datasets

TASKS = ("classification", "regression")
HINT = "fix the CSV file or data.args (train_csv, val_csv, target, features, task)"


@dataclass(frozen=True, eq=False, repr=False)
class TensorPairs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Rows held as two tensors; item i is (inputs[i], targets[i])."""

    inputs: torch.Tensor
    targets: torch.Tensor
    # Column names, and class names by index (empty for regression), for logs and predictions.
    features: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]

    def __repr__(self) -> str:
        # The dataclass repr would print every row into logs.
        return (
            f"TensorPairs(rows={len(self)}, features={self.num_features}, classes={self.classes})"
        )

    @property
    def num_features(self) -> int:
        """Width of one input row (the model's in_features)."""
        return self.inputs.shape[1]


class _Table(NamedTuple):
    path: str
    features: list[str]
    inputs: list[list[float]]
    lines: list[int]  # the file line of each row, for messages about its label
    labels: list[str]
    values: list[float]  # the target as a number, for regression


def data(
    *,
    train_csv: str,
    val_csv: str | None = None,
    target: str = "label",
    features: list[str] | None = None,
    task: str = "classification",
) -> Datasets:
    """Datasets from CSV files with a header row; val_csv is optional (None skips evaluation)."""
    problems = Problems()
    if task not in TASKS:
        problems.add(f"data.args.task={task!r} must be one of {', '.join(TASKS)}")
    if features is not None and not isinstance(features, list | tuple):
        problems.add(f"data.args.features={features!r} must be a list of column names")
    problems.raise_any(HINT)
    # Overrides arrive parsed as YAML, so a column named `1` comes as an int.
    target, features = str(target), None if features is None else [str(n) for n in features]
    train = _read(str(train_csv), target, features, task, problems)
    problems.raise_any(HINT)
    assert train is not None  # _read returns None only after adding a problem
    classes = tuple(sorted(set(train.labels), key=_class_order)) if task == "classification" else ()
    if len(classes) == 1:
        problems.add(f"{train.path} column {target!r} has only one class ({classes[0]!r})")
    val = _read(str(val_csv), target, train.features, task, problems) if val_csv else None
    train_set = _pairs(train, target, classes, problems)
    val_set = _pairs(val, target, classes, problems) if val else None
    problems.raise_any(HINT)
    # In-memory tensors: DataLoader worker processes would only copy them.
    return Datasets(train=train_set, val=val_set, max_workers=0)


def _read(
    path: str, target: str, features: list[str] | None, task: str, problems: Problems
) -> _Table | None:
    """The file's rows, checked; None when no rows could be read or the columns are wrong."""
    before = len(problems) + problems.dropped
    try:
        # utf-8-sig: spreadsheet exports often start with a byte-order mark.
        with open(path, newline="", encoding="utf-8-sig") as file:
            reader = csv.reader(file)
            # line_num is the physical line where a record ends, which is what an editor shows.
            # Spreadsheets pad files with blank and all-comma rows, which are not data.
            rows = [(reader.line_num, row) for row in reader if any(c.strip() for c in row)]
    except FileNotFoundError:
        problems.add(f"{path} does not exist")
        return None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        problems.add(f"{path} cannot be read ({getattr(err, 'strerror', None) or err})")
        return None
    if len(rows) < 2:
        problems.add(f"{path} has no rows" + (" after its header" if rows else " (it is empty)"))
        return None
    header = [name.strip() for name in rows[0][1]]
    names = [name for name in header if name != target] if features is None else list(features)
    for name in dict.fromkeys([target, *names]):
        if name not in header:
            # Lower case, so that `Label` is offered for `label`.
            lowered = {column.lower(): column for column in header}
            close = difflib.get_close_matches(name.lower(), lowered, n=1)
            suggestion = f" (did you mean {lowered[close[0]]!r}?)" if close else ""
            problems.add(f"{path} has no column {name!r}{suggestion}; it has {_shown(header)}")
    if target in names:
        problems.add(f"data.args.features lists the target column {target!r}")
    if not names:
        problems.add(f"{path} has no feature columns besides the target {target!r}")
    if len(set(header)) != len(header):
        problems.add(f"{path} repeats a column name in its header")
    if "" in header:
        problems.add(f"{path} header has no name for column {header.index('') + 1}")
    if len(problems) + problems.dropped > before:
        return None
    where, at_target = [header.index(name) for name in names], header.index(target)
    table = _Table(path, names, [], [], [], [])
    for number, row in rows[1:]:
        if len(row) != len(header):
            problems.add(f"{path} line {number}: {len(row)} values, the header has {len(header)}")
            continue
        table.inputs.append([_number(path, number, header[i], row[i], problems) for i in where])
        label = row[at_target].strip()
        if task == "regression":
            table.values.append(_number(path, number, target, label, problems))
        elif not label:
            problems.add(f"{path} line {number}, column {target!r}: the label is empty")
        table.lines.append(number)
        table.labels.append(label)
    return table


def _number(path: str, line: int, column: str, text: str, problems: Problems) -> float:
    try:
        value = float(text)
    except ValueError:
        problems.add(f"{path} line {line}, column {column!r}: {text!r} is not a number")
        return 0.0
    if not math.isfinite(value):
        # A nan or inf turns every loss into nan many steps later; refuse it here instead.
        problems.add(f"{path} line {line}, column {column!r}: {text!r} is not a finite number")
    return value


def _class_order(label: str) -> tuple[bool, float, str]:
    """Numeric-looking labels first and by value, so "2" sorts before "10"; then the others."""
    try:
        value = float(label)
    except ValueError:
        value = math.nan
    return (False, value, label) if math.isfinite(value) else (True, 0.0, label)


def _pairs(table: _Table, target: str, classes: tuple[str, ...], problems: Problems) -> TensorPairs:
    """Tensors for one file; a label the train file does not have is a problem."""
    inputs = torch.tensor(table.inputs, dtype=torch.float32).reshape(-1, len(table.features))
    if not classes:
        targets = torch.tensor(table.values, dtype=torch.float32)
        return TensorPairs(inputs, targets, tuple(table.features))
    index = {name: i for i, name in enumerate(classes)}
    unseen: dict[str, list[int]] = {}
    for number, label in zip(table.lines, table.labels, strict=True):
        if label not in index:
            unseen.setdefault(label, []).append(number)
    # One problem per unknown label, not per row: a renamed class can cover most of a file.
    for label, numbers in unseen.items():
        more = len(numbers) - 1
        also = f" (and {more} more row{'s' * (more > 1)})" if more else ""
        problems.add(
            f"{table.path} line {numbers[0]}, column {target!r}: label {label!r} is not one of "
            f"the train file's classes ({_shown(classes)}){also}"
        )
    targets = torch.tensor([index.get(label, -1) for label in table.labels], dtype=torch.int64)
    return TensorPairs(inputs, targets, tuple(table.features), classes)


def _shown(names: list[str] | tuple[str, ...]) -> str:
    # A quoted cell may hold a line break; escaped, the problem stays on one line.
    shown = [name if name.isprintable() else repr(name)[1:-1] for name in names[:20]]
    return ", ".join(shown) + (", ..." if len(names) > 20 else "")
