"""TRAINBOX_FAULT: what parses, what is refused and how, and when each fault fires."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trainbox.errors import UsageError
from trainbox.testing import faults
from trainbox.testing.faults import Fault, Injector

VALID = [
    ("kill:rank=1:step=17", [Fault(kind="kill", rank=1, step=17)]),
    ("signal:rank=0:step=3:sig=usr1", [Fault(kind="signal", rank=0, step=3, sig="USR1")]),
    ("signal:rank=0:step=3:sig=SIGINT", [Fault(kind="signal", rank=0, step=3, sig="INT")]),
    ("stall:rank=1:step=5", [Fault(kind="stall", rank=1, step=5, seconds=math.inf)]),
    ("stall:rank=1:step=5:seconds=2.5", [Fault(kind="stall", rank=1, step=5, seconds=2.5)]),
    ("crash:point=rename", [Fault(kind="crash", point="rename")]),
    ("crash:point=write:step=14:rank=1", [Fault(kind="crash", point="write", step=14, rank=1)]),
    ("crash:point=open:step=0", [Fault(kind="crash", point="open", step=0)]),
    (
        " kill:rank=0:step=1 ; crash:point=prune ;",
        [Fault(kind="kill", rank=0, step=1), Fault(kind="crash", point="prune")],
    ),
    (" ; ", []),
    ("slow:rank=2:ms=40", [Fault(kind="slow", rank=2, step=1, seconds=0.04)]),
    ("fork:rank=0:step=20", [Fault(kind="fork", rank=0, step=20)]),
    (
        "pause:rank=2:ms=200:every=500",
        [Fault(kind="pause", rank=2, step=1, seconds=0.2, every_s=0.5)],
    ),
    (
        "pause:rank=1:ms=50:every=80:from=31",
        [Fault(kind="pause", rank=1, step=31, seconds=0.05, every_s=0.08)],
    ),
    ("kill:rank=3:point=handover", [Fault(kind="kill", rank=3, point="handover")]),
    ("kill:rank=1:point=spare", [Fault(kind="kill", rank=1, point="spare")]),
    (
        "slow:rank=0:ms=5:from=30:where=data",
        [Fault(kind="slow", rank=0, step=30, seconds=0.005, where="data")],
    ),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_parse(text: str, expected: list[Fault]) -> None:
    assert faults.parse(text) == tuple(expected)


MALFORMED = [
    (
        "boom:rank=1:step=2",
        "'boom:rank=1:step=2': unknown kind 'boom'"
        " (one of kill, signal, stall, crash, slow, pause, fork)",
    ),
    ("kill:rank:step=2", "'kill:rank:step=2': 'rank' is not key=value"),
    ("crash:", "'crash:': '' is not key=value"),
    ("kill:rank=1:rank=2:step=3", "'kill:rank=1:rank=2:step=3': rank is given twice"),
    ("kill:rank=1:point=open", "'kill:rank=1:point=open': point must be one of spare, handover"),
    (
        "kill:rank=1:step=2:point=spare",
        "'kill:rank=1:step=2:point=spare': kill takes a step or a point, not both",
    ),
    ("stall:rank=1:step=2:sig=USR1", "stall takes ['rank', 'seconds', 'step'], not ['sig']"),
    ("kill:step=2", "'kill:step=2': kill needs ['rank']"),
    ("crash:step=2", "'crash:step=2': crash needs ['point']"),
    (
        "crash:point=flush",
        "'crash:point=flush': point must be one of open, write, fsync, sidecar, rename, latest, prune",
    ),
    ("signal:rank=0:step=1:sig=NOPE", "'signal:rank=0:step=1:sig=NOPE': no signal SIGNOPE"),
    ("signal:rank=0:step=1:sig=_IGN", "no signal SIG_IGN"),
    ("kill:rank=x:step=1", "'kill:rank=x:step=1': rank='x' is not a number"),
    ("kill:rank=-1:step=1", "'kill:rank=-1:step=1': rank must be ≥ 0"),
    ("kill:rank=0:step=0", "'kill:rank=0:step=0': step counts optimizer steps from 1"),
    ("stall:rank=0:step=1:seconds=nan", "seconds='nan' is not a number"),
    ("stall:rank=0:step=1:seconds=-1", "seconds must be ≥ 0"),
    ("slow:rank=1", "'slow:rank=1': slow needs ['ms']"),
    ("slow:rank=1:ms=5:step=3", "slow takes ['from', 'ms', 'rank', 'where'], not ['step']"),
    ("slow:rank=1:ms=5:from=0", "from counts optimizer steps from 1"),
    ("slow:rank=1:ms=inf", "ms must be finite"),
    ("slow:rank=1:ms=5:where=disk", "where must be one of compute, data"),
    ("fork:rank=1", "'fork:rank=1': fork needs ['step']"),
    ("pause:rank=1:ms=50", "'pause:rank=1:ms=50': pause needs ['every']"),
    ("pause:rank=1:ms=50:every=50", "every must be finite and longer than ms"),
    ("pause:rank=1:ms=50:every=inf", "every must be finite and longer than ms"),
    ("pause:rank=1:ms=inf:every=50", "ms must be finite"),
    (
        "pause:rank=1:ms=5:every=9:step=3",
        "pause takes ['every', 'from', 'ms', 'rank'], not ['step']",
    ),
    ("pause:rank=1:ms=5:every=9:from=0", "from counts optimizer steps from 1"),
    ("fork:rank=1:step=2:seconds=3", "fork takes ['rank', 'step'], not ['seconds']"),
]


@pytest.mark.parametrize(("text", "problem"), MALFORMED)
def test_malformed_faults_are_refused_on_one_line(text: str, problem: str) -> None:
    with pytest.raises(UsageError) as raised:
        faults.parse(text)
    line = raised.value.line()
    assert line.startswith("TRAINBOX_FAULT: ")
    assert problem in line
    assert line.count("TRAINBOX_FAULT: '") == 1, "one part, one problem"
    assert "\n" not in line
    assert "HINT: TRAINBOX_FAULT is for tests" in line


def test_every_malformed_part_is_named() -> None:
    with pytest.raises(UsageError) as raised:
        faults.parse("kill:rank=1:step=2;boom;crash:point=nowhere")
    first, second = raised.value.problems
    assert first.startswith("TRAINBOX_FAULT: 'boom': unknown kind")
    assert second.startswith("TRAINBOX_FAULT: 'crash:point=nowhere': point must be one of")


# What a hook did: ("kill", signal), ("sleep", seconds) or ("pause", seconds per stop).
Event = tuple[str, float]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """Record kills, sleeps and stuck forks instead of doing them (the process is pytest)."""
    seen: list[Event] = []

    def kill(pid: int, sig: int) -> None:
        assert pid == os.getpid()
        seen.append(("kill", sig))

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(time, "sleep", lambda seconds: seen.append(("sleep", seconds)))
    monkeypatch.setattr(faults, "_stick_next_fork", lambda: seen.append(("fork", 0)))
    monkeypatch.setattr(faults, "start_pauser", lambda fault: seen.append(("pause", fault.seconds)))
    return seen


def after(step: int) -> Callable[[Injector], None]:
    return lambda injector: injector.after_step(step)


def before(step: int) -> Callable[[Injector], None]:
    return lambda injector: injector.before_step(step)


def saving(point: str, step: int) -> Callable[[Injector], None]:
    return lambda injector: injector.at_save(point, step)


def recovering(point: str) -> Callable[[Injector], None]:
    return lambda injector: injector.at_recovery(point)


# (TRAINBOX_FAULT, this process's rank, the hook it passes, what must happen)
FIRING = [
    pytest.param(
        "kill:rank=1:step=3",
        1,
        after(3),
        [("kill", signal.SIGKILL)],
        id="kill-fires-after-its-step",
    ),
    pytest.param("kill:rank=1:step=3", 0, after(3), [], id="kill-spares-other-ranks"),
    pytest.param("kill:rank=1:step=3", 1, after(2), [], id="kill-waits-for-its-step"),
    pytest.param("kill:rank=1:step=3", 1, before(3), [], id="kill-not-before-the-step"),
    pytest.param(
        "signal:rank=0:step=2:sig=USR1",
        0,
        after(2),
        [("kill", signal.SIGUSR1)],
        id="signal-sends-its-signal",
    ),
    pytest.param(
        "signal:rank=0:step=2",
        0,
        after(2),
        [("kill", signal.SIGTERM)],
        id="signal-defaults-to-TERM",
    ),
    pytest.param(
        "stall:rank=0:step=2:seconds=1.5",
        0,
        before(2),
        [("sleep", 1.5)],
        id="stall-sleeps-before-its-step",
    ),
    pytest.param("stall:rank=0:step=2", 0, before(2), [("sleep", 1e9)], id="stall-for-ever"),
    pytest.param("stall:rank=0:step=2", 0, after(2), [], id="stall-not-after-the-step"),
    pytest.param(
        "crash:point=rename",
        0,
        saving("rename", 7),
        [("kill", signal.SIGKILL)],
        id="crash-hits-the-writer-at-any-step",
    ),
    pytest.param("crash:point=rename", 1, saving("rename", 7), [], id="crash-spares-non-writers"),
    pytest.param("crash:point=rename", 0, saving("sidecar", 7), [], id="crash-only-at-its-point"),
    pytest.param(
        "crash:point=rename:step=14", 0, saving("rename", 7), [], id="crash-waits-for-its-step"
    ),
    pytest.param(
        "crash:point=rename:step=14",
        0,
        saving("rename", 14),
        [("kill", signal.SIGKILL)],
        id="crash-at-its-step",
    ),
    pytest.param(
        "crash:point=rename:rank=1",
        1,
        saving("rename", 7),
        [("kill", signal.SIGKILL)],
        id="crash-on-a-named-rank",
    ),
    pytest.param(
        "crash:point=rename:rank=1", 0, saving("rename", 7), [], id="crash-named-rank-spares-rank-0"
    ),
    pytest.param("crash:point=open", 0, after(1), [], id="crash-not-at-steps"),
    pytest.param(
        "slow:rank=1:ms=20:from=5", 1, after(5), [("sleep", 0.02)], id="slow-from-its-step"
    ),
    pytest.param("slow:rank=1:ms=20:from=5", 1, after(9), [("sleep", 0.02)], id="slow-every-step"),
    pytest.param("slow:rank=1:ms=20:from=5", 1, after(4), [], id="slow-not-before-its-step"),
    pytest.param("slow:rank=1:ms=20", 0, after(5), [], id="slow-spares-other-ranks"),
    pytest.param("slow:rank=1:ms=20:where=data", 1, after(5), [], id="slow-data-not-in-compute"),
    pytest.param(
        "pause:rank=2:ms=200:every=500:from=51",
        2,
        after(51),
        [("pause", 0.2)],
        id="pause-starts-its-watcher-after-its-step",
    ),
    pytest.param(
        "pause:rank=2:ms=200:every=500:from=51", 2, after(52), [], id="pause-starts-it-once"
    ),
    pytest.param(
        "pause:rank=2:ms=200:every=500:from=51", 1, after(51), [], id="pause-spares-other-ranks"
    ),
    pytest.param("fork:rank=1:step=4", 1, after(4), [("fork", 0)], id="fork-after-its-step"),
    pytest.param("fork:rank=1:step=4", 1, before(4), [], id="fork-not-before-the-step"),
    pytest.param("fork:rank=1:step=4", 0, after(4), [], id="fork-spares-other-ranks"),
    pytest.param(
        "kill:rank=2:point=handover",
        2,
        recovering("handover"),
        [("kill", signal.SIGKILL)],
        id="kill-at-a-recovery-point",
    ),
    pytest.param(
        "kill:rank=2:point=handover", 2, recovering("spare"), [], id="kill-only-at-its-point"
    ),
    pytest.param(
        "kill:rank=2:point=spare", 1, recovering("spare"), [], id="kill-point-spares-other-ranks"
    ),
    pytest.param("kill:rank=2:point=spare", 2, after(1), [], id="kill-at-a-point-not-after-steps"),
]


def test_a_slow_data_fault_delays_each_steps_first_batch(events: list[Event]) -> None:
    injector = Injector(faults.parse("slow:rank=0:ms=30:from=3:where=data"), rank=0)
    batches = injector.data(iter(range(8)), first_step=2, per_step=2)
    assert list(batches) == list(range(8))
    # Steps 2..5, two micro-batches each: steps 3, 4 and 5 wait before their first batch.
    assert events == [("sleep", 0.03)] * 3


def test_without_a_slow_data_fault_the_batches_are_untouched() -> None:
    batches = iter(range(3))
    injector = Injector(faults.parse("slow:rank=0:ms=30"), rank=0)
    assert injector.data(batches, first_step=1, per_step=1) is batches


@pytest.mark.parametrize(("text", "rank", "call", "expected"), FIRING)
def test_when_a_fault_fires(
    events: list[Event],
    text: str,
    rank: int,
    call: Callable[[Injector], None],
    expected: list[Event],
) -> None:
    call(Injector(faults.parse(text), rank=rank))
    assert events == expected


def test_without_a_once_marker_a_fault_fires_every_time(events: list[Event]) -> None:
    injector = Injector(faults.parse("crash:point=latest"), rank=0)
    injector.at_save("latest", 7)
    injector.at_save("latest", 14)
    assert events == [("kill", signal.SIGKILL)] * 2


def test_a_once_marker_fires_a_fault_once_across_restarts(
    events: list[Event], tmp_path: Path
) -> None:
    once = tmp_path / "once"
    first = Injector(faults.parse("kill:rank=0:step=3"), rank=0, once=once)
    first.after_step(3)
    first.after_step(3)
    # A restarted process builds a new injector from the same environment.
    Injector(faults.parse("kill:rank=0:step=3"), rank=0, once=once).after_step(3)
    assert events == [("kill", signal.SIGKILL)]
    assert (tmp_path / "once.0").exists()


def test_once_markers_are_numbered_by_the_faults_place_in_the_list(
    events: list[Event], tmp_path: Path
) -> None:
    # Rank 1 skips the first fault, yet marks the second as .1, the name every rank uses.
    injector = Injector(
        faults.parse("kill:rank=0:step=3;kill:rank=1:step=3"), rank=1, once=tmp_path / "once"
    )
    injector.after_step(3)
    assert events == [("kill", signal.SIGKILL)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["once.1"]


def test_a_spent_fault_leaves_the_others_armed(events: list[Event], tmp_path: Path) -> None:
    (tmp_path / "once.0").touch()
    injector = Injector(
        faults.parse("stall:rank=0:step=2:seconds=1;kill:rank=0:step=2"),
        rank=0,
        once=tmp_path / "once",
    )
    injector.before_step(2)
    injector.after_step(2)
    assert events == [("kill", signal.SIGKILL)]


@pytest.mark.parametrize(
    "env", [{}, {"TRAINBOX_FAULT": ""}, {"TRAINBOX_FAULT_ONCE": "/nowhere/once"}]
)
def test_from_env_is_inert_without_a_fault(events: list[Event], env: dict[str, str]) -> None:
    injector = faults.from_env(env, rank=0)
    assert injector.faults == ()
    injector.before_step(1)
    injector.after_step(1)
    for point in faults.SAVE_POINTS:
        injector.at_save(point, 1)
    assert events == []


def test_from_env_reads_the_fault_and_the_once_marker(events: list[Event], tmp_path: Path) -> None:
    env = {
        "TRAINBOX_FAULT": "crash:point=fsync:step=14",
        "TRAINBOX_FAULT_ONCE": str(tmp_path / "once"),
    }
    faults.from_env(env, rank=0).at_save("fsync", 14)
    faults.from_env(env, rank=0).at_save("fsync", 14)
    assert events == [("kill", signal.SIGKILL)]


def test_from_env_refuses_a_malformed_fault() -> None:
    with pytest.raises(UsageError, match="unknown kind 'explode'"):
        faults.from_env({"TRAINBOX_FAULT": "explode:rank=0"}, rank=0)


def test_a_pause_watcher_ends_with_the_process_it_pauses() -> None:
    # A process starts a watcher and exits: the watcher must not outlive it, or a finished
    # rank's watcher would stop whatever process took its pid next.
    script = (
        "from trainbox.testing import faults\n"
        "fault = faults.parse('pause:rank=0:ms=10:every=60')[0]\n"
        "print(faults.start_pauser(fault).pid)\n"
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, timeout=30)  # fmt: skip
    watcher = int(child.stdout)
    deadline = time.monotonic() + 10
    while _alive(watcher) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(watcher), "the watcher outlived the process it paused"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
