"""Fault injection for tests: inert unless TRAINBOX_FAULT is set.

TRAINBOX_FAULT holds one or more faults separated by `;`, each `KIND:key=value:...`:

    kill:rank=R:step=S          SIGKILL rank R right after optimizer step S
    kill:rank=R:point=P         dist.recovery=in_process: SIGKILL rank R's spare as it starts
                                waiting (P=spare), or rank R as it starts handing the state over
                                in a re-formed group (P=handover)
    signal:rank=R:step=S:sig=N  send signal N (TERM, USR1, ...) to rank R after step S
    stall:rank=R:step=S[:seconds=T]   rank R sleeps T seconds (default: for ever) before step S
    crash:point=P[:step=S][:rank=R]   SIGKILL the checkpoint writer at save point P (of step S);
                                with run_dir=s3://, also at an upload point: `upload` (the
                                checkpoint's objects are in the store, its marker is not) or
                                `marker` (the marker is in, the run's files and prune are not)
    slow:rank=R:ms=X[:from=S][:where=W]  rank R takes X ms longer for every step from step S
                                (default 1): in its own work (where=compute, the default) or
                                in fetching each step's first batch (where=data)
    pause:rank=R:ms=X:every=Y[:from=S]  from step S (default 1) on, a watcher process stops
                                rank R (SIGSTOP) for X ms of every Y ms, then lets it go on
                                (SIGCONT): a descheduled VM, a throttled container or a long
                                GC pause, seen from outside
    fork:rank=R:step=S          the first process rank R forks after step S (a DataLoader
                                worker) blocks for ever inside the fork, as a child caught by
                                CPython's fork deadlock does (train/data/workers.py)

With TRAINBOX_FAULT_ONCE=PATH each fault fires at most once across restarts: firing first
creates PATH.N (N = the fault's index), and an existing PATH.N disarms it.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from trainbox.errors import UsageError

# Where a checkpoint save can be cut short, in the order a save passes them.
SAVE_POINTS = ("open", "write", "fsync", "sidecar", "rename", "latest", "prune")
# Where the upload of a checkpoint to an object store can be cut short (train/resume/run_store.py).
UPLOAD_POINTS = ("upload", "marker")
# Where in-process recovery can lose a process (train/recovery.py, distributed/regroup.py).
RECOVERY_POINTS = ("spare", "handover")
KINDS = ("kill", "signal", "stall", "crash", "slow", "pause", "fork")
# Where a slow fault adds its time.
WHERE = ("compute", "data")
T = TypeVar("T")
_HINT = (
    "TRAINBOX_FAULT is for tests: e.g. kill:rank=1:step=17 or crash:point=rename;"
    " unset it for real runs"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    """One fault to inject."""

    # One of KINDS.
    kind: str
    # The rank it hits; None: any rank (crash: the writer, rank 0).
    rank: int | None = None
    # The optimizer step it fires at; None: any step (crash only).
    step: int | None = None
    # crash: the save point.
    point: str | None = None
    # signal: the signal's name without SIG.
    sig: str = "TERM"
    # stall: how long to sleep; inf stalls for ever. slow: how long each step takes longer.
    # pause: how long each stop lasts.
    seconds: float = math.inf
    # slow: where the time goes (WHERE).
    where: str = "compute"
    # pause: seconds from the start of one stop to the start of the next.
    every_s: float = 0.0


def parse(text: str) -> tuple[Fault, ...]:
    """The faults a TRAINBOX_FAULT value names; UsageError lists every malformed part."""
    faults: list[Fault] = []
    problems: list[str] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        kind, *fields = part.split(":")
        values: dict[str, str] = {}
        try:
            for item in fields:
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"{item!r} is not key=value")
                if key in values:
                    raise ValueError(f"{key} is given twice")
                values[key] = value
            faults.append(_build(kind, values))
        except ValueError as err:
            # One problem per part: the first thing wrong with it.
            problems.append(f"{part!r}: {err}")
    if problems:
        raise UsageError([f"TRAINBOX_FAULT: {p}" for p in problems], hint=_HINT)
    return tuple(faults)


def _build(kind: str, values: dict[str, str]) -> Fault:
    allowed = {
        "kill": {"rank", "step", "point"},
        "signal": {"rank", "step", "sig"},
        "stall": {"rank", "step", "seconds"},
        "crash": {"rank", "step", "point"},
        "slow": {"rank", "ms", "from", "where"},
        "pause": {"rank", "ms", "every", "from"},
        "fork": {"rank", "step"},
    }
    if kind not in allowed:
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    unknown = sorted(set(values) - allowed[kind])
    if unknown:
        raise ValueError(f"{kind} takes {sorted(allowed[kind])}, not {unknown}")
    required = {"crash": {"point"}, "slow": {"rank", "ms"},
                "pause": {"rank", "ms", "every"}}.get(kind, {"rank", "step"})  # fmt: skip
    if kind == "kill" and "point" in values:
        required = {"rank", "point"}
    missing = sorted(required - set(values))
    if missing:
        raise ValueError(f"{kind} needs {missing}")
    point = values.get("point")
    points = RECOVERY_POINTS if kind == "kill" else (*SAVE_POINTS, *UPLOAD_POINTS)
    if point is not None and point not in points:
        raise ValueError(f"point must be one of {', '.join(points)}")
    if kind == "kill" and point is not None and "step" in values:
        raise ValueError("kill takes a step or a point, not both")
    sig = values.get("sig", "TERM").upper().removeprefix("SIG")
    # signal.Signals, not any SIG* attribute: SIG_IGN and SIG_DFL are handlers, not signals.
    if f"SIG{sig}" not in signal.Signals.__members__:
        raise ValueError(f"no signal SIG{sig}")
    where = values.get("where", "compute")
    if where not in WHERE:
        raise ValueError(f"where must be one of {', '.join(WHERE)}")
    # slow and pause go on from a step; the others fire at one.
    lasting = kind in ("slow", "pause")
    step = _number(values, "from" if lasting else "step", int)
    if lasting and step is None:
        step = 1
    # kill, signal and stall fire around optimizer steps, which count from 1: 0 would never fire.
    if step == 0 and kind != "crash":
        raise ValueError(f"{'from' if lasting else 'step'} counts optimizer steps from 1")
    if lasting and not math.isfinite(ms := _number(values, "ms", float)):
        raise ValueError("ms must be finite")
    if kind == "slow":
        return Fault(kind=kind, rank=_number(values, "rank", int), step=step,
                     seconds=ms / 1e3, where=where)  # fmt: skip
    if kind == "pause":
        every = _number(values, "every", float)
        if not ms < every < math.inf:
            raise ValueError("every must be finite and longer than ms (the rank must run)")
        return Fault(kind=kind, rank=_number(values, "rank", int), step=step,
                     seconds=ms / 1e3, every_s=every / 1e3)  # fmt: skip
    return Fault(
        kind=kind,
        rank=_number(values, "rank", int),
        step=step,
        point=point,
        sig=sig,
        seconds=math.inf if "seconds" not in values else _number(values, "seconds", float),
    )


def _number(values: dict[str, str], key: str, kind: type[float] | type[int]) -> Any:
    if key not in values:
        return None
    try:
        number = kind(values[key])
    except ValueError:
        raise ValueError(f"{key}={values[key]!r} is not a number") from None
    if math.isnan(number):
        raise ValueError(f"{key}={values[key]!r} is not a number")
    if number < 0:
        raise ValueError(f"{key} must be ≥ 0")
    return number


class Injector:
    """Fires the configured faults at the trainer's hook points; inert when there are none."""

    def __init__(self, faults: tuple[Fault, ...], *, rank: int, once: Path | None = None) -> None:
        self.faults = tuple((index, f) for index, f in enumerate(faults) if _hits(f, rank))
        self.once = once

    def before_step(self, step: int) -> None:
        """Stall faults, fired as rank R starts step `step`."""
        for index, fault in self.faults:
            if fault.kind == "stall" and fault.step == step and self._arm(index):
                time.sleep(fault.seconds if math.isfinite(fault.seconds) else 1e9)

    def after_step(self, step: int) -> None:
        """Kill, signal and fork faults, fired after rank R's optimizer step `step`; slow ones
        (where=compute) add their time to every step from theirs; pause ones start their
        watcher after theirs."""
        for index, fault in self.faults:
            if fault.kind == "slow" and fault.where == "compute" and step >= (fault.step or 1):
                time.sleep(fault.seconds)
                continue
            if fault.kind == "pause" and fault.step == step and self._arm(index):
                start_pauser(fault)
                continue
            if fault.step != step or fault.kind not in ("kill", "signal", "fork") or fault.point:
                continue
            if fault.kind == "fork":
                if self._arm(index):
                    _stick_next_fork()
            elif self._arm(index):
                sig = signal.SIGKILL if fault.kind == "kill" else getattr(signal, f"SIG{fault.sig}")
                os.kill(os.getpid(), sig)

    def data(self, batches: Iterator[T], *, first_step: int, per_step: int) -> Iterator[T]:
        """`batches` (per_step micro-batches a step, from step `first_step`), made slower by
        slow faults with where=data; `batches` itself when there are none."""
        slow = [fault for _, fault in self.faults if fault.kind == "slow" and fault.where == "data"]
        if not slow:
            return batches
        return _slowed(batches, slow, first_step=first_step, per_step=per_step)

    def at_save(self, point: str, step: int) -> None:
        """Crash faults, fired as the checkpoint of `step` passes `point`."""
        for index, fault in self.faults:
            if fault.kind != "crash" or fault.point != point:
                continue
            if fault.step in (None, step) and self._arm(index):
                os.kill(os.getpid(), signal.SIGKILL)

    def at_recovery(self, point: str) -> None:
        """Kill faults with a recovery point, fired as this process passes `point`."""
        for index, fault in self.faults:
            if fault.kind == "kill" and fault.point == point and self._arm(index):
                os.kill(os.getpid(), signal.SIGKILL)

    def _arm(self, index: int) -> bool:
        if self.once is None:
            return True
        marker = Path(f"{self.once}.{index}")
        try:
            # O_EXCL: of two ranks or two restarts, only the first to get here fires.
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def _slowed(
    batches: Iterator[T], faults: list[Fault], *, first_step: int, per_step: int
) -> Iterator[T]:
    """A slow data pipeline: each step's first batch comes the faults' time later."""
    for index, batch in enumerate(batches):
        step, micro = divmod(index, per_step)
        delay = sum(f.seconds for f in faults if first_step + step >= (f.step or 1))
        if micro == 0 and delay:
            time.sleep(delay)
        yield batch


# The pause fault's watcher: stops the process `pid` for `stop` seconds of every `every`, and
# ends (letting it go on) once its parent, that process, is gone. A process of its own, since a
# thread of the rank would be stopped with it; plain Python, so it starts in milliseconds.
PAUSER = """
import os, signal, sys, time
pid, stop, every = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
def go_on(*_):
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    sys.exit(0)
signal.signal(signal.SIGTERM, go_on)
try:
    while os.getppid() == pid:
        time.sleep(every - stop)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stop)
        os.kill(pid, signal.SIGCONT)
except ProcessLookupError:
    pass
"""


def start_pauser(fault: Fault) -> subprocess.Popen[bytes]:
    """Start the watcher that pauses this process as the pause fault `fault` says; it ends
    with this process, or with stop_pauser."""
    argv = [sys.executable, "-c", PAUSER, str(os.getpid()), str(fault.seconds),
            str(fault.every_s)]  # fmt: skip
    # subprocess forks and execs in C, running no Python in the child: safe beside threads.
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def stop_pauser(watcher: subprocess.Popen[bytes]) -> None:
    """End a watcher; it lets this process go on first (SIGCONT) if it was stopping it."""
    if watcher.poll() is None:
        watcher.terminate()
        watcher.wait()


def _hits(fault: Fault, rank: int) -> bool:
    # A crash hits the checkpoint writer unless a rank is named.
    wanted = fault.rank if fault.rank is not None else (0 if fault.kind == "crash" else None)
    return wanted is None or wanted == rank


def from_env(env: Mapping[str, str], *, rank: int) -> Injector:
    """The injector TRAINBOX_FAULT asks for; inert when it is unset or empty."""
    text = env.get("TRAINBOX_FAULT", "")
    once = env.get("TRAINBOX_FAULT_ONCE")
    return Injector(parse(text) if text else (), rank=rank, once=Path(once) if once else None)


# Whether the next fork's child blocks; set by a fork fault, cleared by that fork in the parent.
_fork_armed = False
_fork_hooks = False


def _stick_next_fork() -> None:
    """The child of this process's next fork blocks for ever before os.fork returns in it."""
    global _fork_armed, _fork_hooks
    _fork_armed = True
    if not _fork_hooks:
        os.register_at_fork(after_in_child=_stuck_child, after_in_parent=_disarm)
        _fork_hooks = True


def _stuck_child() -> None:
    # Like a child stuck on the interpreter's lock: no code of its own runs, and SIGTERM (the
    # parent's handler) does not end it; SIGKILL does.
    while _fork_armed:
        time.sleep(3600)


def _disarm() -> None:
    global _fork_armed
    _fork_armed = False
