"""Hang evidence: each rank writes the Python stacks of all its threads to run_dir/hang/.

Written by the rank itself once the job is judged hung, before it exits: from the watchdog
thread while the main thread is stuck (a stuck C call holds no Python frame the watchdog cannot
read), or from the main thread with the traceback of the collective that timed out. One file
per rank, no gather: O(1) per rank at any world size. `trainbox hang RUN_DIR` reads them
(hang_report.py).

The format, one file per rank (`rank-00003.txt`): `key: value` header lines, a blank line, then
one section per thread, `Thread NAME (ident N)[ main]:` followed by the stack in traceback's
own format, outermost frame first.
"""

from __future__ import annotations

import sys
import sysconfig
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType

from trainbox import atomic

# The folder under run_dir.
EVIDENCE_DIR = "hang"
# Ends the main thread's section line, so the reader knows which stack to read.
MARK_MAIN = " main"


def file_name(rank: int) -> str:
    """The evidence file of `rank`, sortable by rank."""
    return f"rank-{rank:05d}.txt"


def library_roots() -> tuple[str, ...]:
    """Directories whose frames are library frames (torch, the standard library) on this host:
    the reader skips them to find the innermost frame of user or trainbox code."""
    roots = {sysconfig.get_paths()["stdlib"]}
    torch = sys.modules.get("torch")
    where = getattr(torch, "__file__", None)
    if isinstance(where, str):
        roots.add(str(Path(where).parent))
    return tuple(sorted(roots))


def render(
    header: Mapping[str, object],
    stacks: Sequence[tuple[str, int, bool, traceback.StackSummary]],
) -> str:
    """The file's text: header lines, then each thread (name, ident, is main, stack)."""
    lines = [f"{key}: {' '.join(str(value).split())}" for key, value in header.items()]
    lines.append("")
    for name, ident, main, stack in stacks:
        lines.append(f"Thread {name} (ident {ident}){MARK_MAIN if main else ''}:")
        lines.extend(line.rstrip("\n") for line in stack.format())
        lines.append("")
    return "\n".join(lines)


def thread_stacks(
    main_tb: TracebackType | None = None,
) -> list[tuple[str, int, bool, traceback.StackSummary]]:
    """Every thread's stack now; the main thread's from `main_tb` when given (the collective
    that failed, where the main thread was until it raised)."""
    frames: dict[int, FrameType] = sys._current_frames()
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main_ident = threading.main_thread().ident
    stacks = []
    for ident, frame in sorted(frames.items(), key=lambda item: item[0] != main_ident):
        main = ident == main_ident
        if main and main_tb is not None:
            stack = _failed_stack(frame, main_tb)
        else:
            stack = traceback.extract_stack(frame)
        if ident == threading.get_ident():
            stack = _without_the_writer(stack)
        stacks.append((names.get(ident, "unnamed"), ident, main, stack))
    return stacks


def _failed_stack(now: FrameType, tb: TracebackType) -> traceback.StackSummary:
    """The main thread's stack where it failed: the frames still running outside the failure
    (outermost first), then the traceback from the first of its frames still on the stack."""
    failed = list(traceback.walk_tb(tb))
    ids = {id(frame) for frame, _ in failed}
    chain: list[FrameType] = []
    frame: FrameType | None = now
    while frame is not None:
        chain.append(frame)
        frame = frame.f_back
    chain.reverse()
    joint = next((f for f in chain if id(f) in ids), None)
    if joint is None:
        return traceback.StackSummary.extract(iter(failed))
    outer = [(f, f.f_lineno) for f in chain[: chain.index(joint)]]
    start = next(index for index, (f, _) in enumerate(failed) if f is joint)
    return traceback.StackSummary.extract(iter(outer + failed[start:]))


def _without_the_writer(stack: traceback.StackSummary) -> traceback.StackSummary:
    """The writing thread's stack without the watchdog's own innermost frames (this writer)."""
    own = str(Path(__file__).parent)
    frames = list(stack)
    while frames and str(Path(frames[-1].filename).parent) == own:
        frames.pop()
    return traceback.StackSummary.from_list(frames)


def write(
    directory: Path,
    *,
    header: Mapping[str, object],
    main_tb: TracebackType | None = None,
) -> Path:
    """Write this rank's evidence under `directory` (made if missing); returns the file."""
    directory.mkdir(parents=True, exist_ok=True)
    full = {**header, "library": ", ".join(library_roots())}
    path = directory / file_name(int(str(header["rank"])))
    atomic.write_text(path, render(full, thread_stacks(main_tb)))
    return path
