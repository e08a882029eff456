"""Slurm's compressed host and task lists: `gpu[01-04,07],cpu3` and `2(x3),1`."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_BRACKETS = re.compile(r"[\[\]]")
# One host pattern: runs of anything but separators and brackets, and whole bracket groups.
_TOP_LEVEL = re.compile(r"(?:[^\s,\[\]]+|\[[^\]]*\])+")

# One piece of a host pattern: a literal, or the (low, high, width) ranges of a bracket group.
_Piece = str | tuple[tuple[int, int, int], ...]


def expand(hostlist: str) -> list[str]:
    """Every host named by a Slurm hostlist, in order; ValueError if it is malformed."""
    return list(_hosts(hostlist))


def first_host(hostlist: str) -> str:
    """The first host of a hostlist without expanding the rest (the whole list is still checked)."""
    patterns = _parse(hostlist)
    return "".join(
        piece if isinstance(piece, str) else str(piece[0][0]).zfill(piece[0][2])
        for piece in patterns[0]
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskCounts:
    """SLURM_TASKS_PER_NODE kept as its runs, so `8(x4096)` costs one entry, not 4,096."""

    # (tasks on each node, how many consecutive nodes) in node order.
    runs: tuple[tuple[int, int], ...]

    @property
    def nodes(self) -> int:
        """How many nodes the list covers."""
        return sum(repeat for _, repeat in self.runs)

    def on_node(self, node: int) -> int | None:
        """The task count of node index `node`, or None past the end of the list."""
        for tasks, repeat in self.runs:
            if node < repeat:
                return tasks
            node -= repeat
        return None


def task_counts(text: str) -> TaskCounts:
    """Parse SLURM_TASKS_PER_NODE's `2(x3),1`; ValueError if malformed."""
    runs: list[tuple[int, int]] = []
    for item in text.split(","):
        match = _TASKS.fullmatch(item.strip())
        if match is None or int(match[2] or 1) < 1:
            raise ValueError(f"{item!r} is not N or N(xM)")
        runs.append((int(match[1]), int(match[2] or 1)))
    return TaskCounts(runs=tuple(runs))


def _parse(hostlist: str) -> list[list[_Piece]]:
    patterns = [_parse_pattern(item) for item in _split_top_level(hostlist)]
    if not patterns:
        raise ValueError("no host in the list")
    return patterns


def _hosts(hostlist: str) -> Iterator[str]:
    for pieces in _parse(hostlist):
        yield from _expand_pattern(pieces)


def _split_top_level(text: str) -> list[str]:
    # Commas and spaces separate hosts only outside brackets: `a[1,3],b` is two patterns. Regex
    # scans, not a loop per character: a 10,000-node list is ~100 kB, parsed on every rank.
    opened = False
    for bracket in _BRACKETS.findall(text):
        if bracket == "[" and opened:
            raise ValueError("nested '['")
        if bracket == "]" and not opened:
            raise ValueError("']' without '['")
        opened = bracket == "["
    if opened:
        raise ValueError("'[' without ']'")
    # Spaces inside a bracket group (`[089, 100-101]`) separate nothing: drop them.
    return ["".join(item.split()) for item in _TOP_LEVEL.findall(text)]


def _parse_pattern(item: str) -> list[_Piece]:
    pieces: list[_Piece] = []
    for index, part in enumerate(re.split(r"\[([^\]]*)\]", item)):
        if index % 2 == 0:
            if part:
                pieces.append(part)
        else:
            pieces.append(tuple(_parse_range(text) for text in part.split(",")))
    return pieces


def _parse_range(text: str) -> tuple[int, int, int]:
    match = _RANGE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a number or a range N-M")
    low, high = int(match[1]), int(match[2] or match[1])
    if high < low:
        raise ValueError(f"range {text!r} runs backwards")
    # Slurm keeps the zero padding of the lower bound: [08-10] gives 08, 09, 10.
    return low, high, len(match[1])


def _expand_pattern(pieces: list[_Piece]) -> Iterator[str]:
    choices = [[piece] if isinstance(piece, str) else list(_numbers(piece)) for piece in pieces]
    for combo in itertools.product(*choices):
        yield "".join(combo)


def _numbers(ranges: tuple[tuple[int, int, int], ...]) -> Iterator[str]:
    for low, high, width in ranges:
        for number in range(low, high + 1):
            yield str(number).zfill(width)
