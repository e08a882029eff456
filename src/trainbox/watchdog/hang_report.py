"""Pure: the evidence files of a hang (evidence.py) → a few lines saying who was stuck where.

Ranks that were doing the same thing (the same mark and the same innermost frame of user or
trainbox code on the main thread) share one line, so 4,096 ranks print a handful.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainbox.watchdog.evidence import MARK_MAIN

_FRAME = re.compile(r'^  File "(?P<path>.*)", line (?P<line>\d+), in (?P<func>.*)$')


@dataclass(frozen=True, kw_only=True, slots=True)
class Frame:
    """One frame of a stack, as traceback printed it."""

    path: str
    line: int
    func: str

    def short(self) -> str:
        """`dir/file.py:123 in func`: enough to find it, the same on every host."""
        tail = "/".join(self.path.replace("\\", "/").split("/")[-2:])
        return f"{tail}:{self.line} in {self.func}"


@dataclass(frozen=True, kw_only=True, slots=True)
class RankEvidence:
    """What one rank's file says."""

    rank: int
    header: Mapping[str, str]
    # The main thread's frames, outermost first; user and trainbox frames only.
    main: tuple[Frame, ...]
    # How many threads the file holds.
    threads: int

    @property
    def doing(self) -> str:
        """The watchdog's mark: the operation and the step."""
        return f"{self.header.get('op', '?')} at step {self.header.get('step', '?')}"

    @property
    def where(self) -> str:
        """The innermost frame of user or trainbox code on the main thread."""
        return self.main[-1].short() if self.main else "no Python frame of user or trainbox code"


def parse(text: str) -> RankEvidence:
    """One evidence file; ValueError when it is not one."""
    head, _, body = text.partition("\n\n")
    header: dict[str, str] = {}
    for line in head.splitlines():
        key, sep, value = line.partition(": ")
        if not sep:
            raise ValueError(f"not a header line: {line[:80]!r}")
        header[key] = value
    if not header.get("rank", "").isdigit():
        raise ValueError("no rank in the header")
    roots = tuple(r for r in header.get("library", "").split(", ") if r)
    threads, main, in_main = 0, [], False
    for line in body.splitlines():
        if line.startswith("Thread ") and line.endswith(":"):
            threads += 1
            in_main = line[:-1].endswith(MARK_MAIN)
        elif in_main and (match := _FRAME.match(line)):
            path = match["path"]
            if not any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots):
                main.append(Frame(path=path, line=int(match["line"]), func=match["func"]))
    return RankEvidence(rank=int(header["rank"]), header=header, main=tuple(main), threads=threads)


def ranges(ranks: Iterable[int]) -> str:
    """`0-2,4,6-4095` for a set of ranks."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _label(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"


def summarize(texts: Mapping[str, str]) -> list[str]:
    """The report's lines from evidence files (name → text): the verdict, one line per group
    of ranks doing the same thing, where their stacks first differ, ranks without a file."""
    found: dict[int, RankEvidence] = {}
    lines: list[str] = []
    for name, text in sorted(texts.items()):
        try:
            evidence = parse(text)
        except ValueError as err:
            lines.append(f"{name}: unreadable ({err})")
            continue
        found[evidence.rank] = evidence
    if not found:
        return [*lines, "no hang evidence found"]
    verdicts = [e.header.get("verdict", "") for e in found.values() if e.header.get("verdict")]
    if verdicts:
        # Every rank holds the job's one verdict; the first judge's words.
        lines.insert(0, f"verdict: {verdicts[0]}")
    groups: dict[tuple[str, str], list[int]] = {}
    for rank, evidence in sorted(found.items()):
        groups.setdefault((evidence.doing, evidence.where), []).append(rank)
    # The smallest group first: the odd one out is usually the culprit.
    ordered = sorted(groups.items(), key=lambda item: (len(item[1]), item[1][0]))
    for (doing, where), ranks in ordered:
        lines.append(f"{_label(ranks)}: in {doing}, at {where}")
    if len(ordered) > 1:
        lines.append(_first_difference([found[ranks[0]] for _, ranks in ordered]))
    world = max(int(e.header.get("world_size", "0") or 0) for e in found.values())
    missing = sorted(set(range(world)) - set(found))
    if missing:
        lines.append(
            f"no evidence from {_label(missing)} (exited, killed, or unable to run Python)"
        )
    return lines


def _first_difference(samples: list[RankEvidence]) -> str:
    """Where the main threads' stacks (user and trainbox frames, outermost first) part."""
    stacks = [[frame.short() for frame in sample.main] for sample in samples]
    depth = 0
    while all(len(stack) > depth for stack in stacks) and len({s[depth] for s in stacks}) == 1:
        depth += 1
    after = f"after {stacks[0][depth - 1]}" if depth else "at the outermost frame"
    each = "; ".join(
        f"rank {sample.rank}: {stack[depth] if len(stack) > depth else '(ends here)'}"
        for sample, stack in zip(samples, stacks, strict=True)
    )
    return f"first difference {after}: {each}"
