"""The pause meter (health/pauses.py): a late wake-up counted as a pause only where the training
thread did not run; a real SIGSTOP seen and charged to the part the training thread was in; a
training thread that keeps the interpreter's lock not taken for a pause."""

from __future__ import annotations

import math
import random
import time

import pytest

from trainbox.health import pauses
from trainbox.health.pauses import PauseMeter, paused_s
from trainbox.testing import faults

# The parts of a step, as the step clock numbers them.
OUTSIDE, DATA, COMPUTE, WAIT = range(4)


# (how late the meter woke, the training thread's CPU since its last wake-up, the pause seen)
PAUSED = [
    pytest.param(0.001, 0.0, 0.0, id="timer-slack-is-no-pause"),
    pytest.param(0.2, 0.0, 0.195, id="stopped-while-waiting"),
    pytest.param(0.2, 0.04, 0.195, id="stopped-after-working-while-the-meter-slept"),
    pytest.param(0.2, 0.25, 0.0, id="the-training-thread-ran-all-along"),
    pytest.param(0.2, 0.15, 0.095, id="it-ran-half-the-lateness"),
    pytest.param(0.004, 0.0, 0.0, id="the-interpreters-lock-handed-over"),
]


@pytest.mark.parametrize(("late", "busy", "expected"), PAUSED)
def test_a_late_wake_up_is_a_pause_only_where_the_training_thread_did_not_run(
    late: float, busy: float, expected: float
) -> None:
    lost = paused_s(late_s=late, busy_s=busy, period_s=0.05, slack_s=0.005)
    assert lost == pytest.approx(expected)


def test_the_meter_sees_a_real_stop_where_the_training_thread_was() -> None:
    # The pause fault's own watcher stops this process with SIGSTOP for 150 ms of every 250 ms
    # while the training thread "waits in the collective" (sleeps, as a blocked thread does).
    phase = [WAIT]
    meter = PauseMeter(lambda: phase[0], phases=4)
    meter.start()
    watcher = faults.start_pauser(
        faults.Fault(kind="pause", rank=0, step=1, seconds=0.15, every_s=0.25)
    )
    try:
        time.sleep(1.0)
    finally:
        faults.stop_pauser(watcher)
        meter.stop()
    lost = meter.take()
    # 3 or 4 stops in that second (the watcher starts in some tens of ms), each seen but for up
    # to one period and the slack.
    assert 3 * (0.15 - pauses.PERIOD_S - pauses.SLACK_S) <= lost[WAIT] <= 5 * 0.15
    assert lost[COMPUTE] == lost[DATA] == lost[OUTSIDE] == 0.0


def test_the_meter_counts_no_pause_while_the_training_thread_holds_the_lock() -> None:
    # Sorting a million floats is one C call that keeps the interpreter's lock (~0.5 s here):
    # the meter cannot wake, yet the process ran.
    meter = PauseMeter(lambda: COMPUTE, phases=4)
    numbers = [random.random() for _ in range(1_000_000)]
    meter.start()
    try:
        time.sleep(2 * pauses.PERIOD_S)
        started = time.perf_counter()
        sorted(numbers)
        held = time.perf_counter() - started
        time.sleep(2 * pauses.PERIOD_S)
    finally:
        meter.stop()
    assert held > 2 * pauses.PERIOD_S, "the sort was too quick to show anything"
    # Only what the host's other work took from it (none on a quiet machine) may count.
    assert math.fsum(meter.take()) < 0.5 * held
