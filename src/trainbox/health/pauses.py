"""The pause meter: how long this process was ready to run and did not run.

A process that is stopped (SIGSTOP), descheduled (a host with more work than CPUs, a cgroup
whose CPU quota is spent, a VM whose vCPU the hypervisor took) does nothing, and afterwards
nothing in it can tell: its clocks read the time that passed as if it had been waiting. When
the pause falls while the rank sits in the step's collective, every rank's wait grows by it and
the rank's own work looks normal, so only something that wanted to run during the pause can
see it. That is this meter: a thread that asks to wake every PERIOD_S and counts how late it
woke, charged to the phase of the step the training thread was in (health/step_clock.py).

Lateness the training thread spent running is its own work, not a pause: a long C call that
holds the interpreter's lock, or a garbage collection, keeps the meter from waking too. So the
meter reads the training thread's CPU clock and counts only what that thread did not run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# How often the meter asks to wake. A pause longer than this is seen but for up to one period
# (half of one on average); shorter ones only when they cover a wake-up. Each wake-up costs a
# few tens of µs of CPU (benchmarks/health_cost.py measures it).
PERIOD_S = 0.05
# Lateness that is no pause: the timer's slack and the wait for the interpreter's lock, which a
# thread running Python hands over every sys.getswitchinterval() (5 ms).
SLACK_S = 0.005


def paused_s(*, late_s: float, busy_s: float, period_s: float, slack_s: float) -> float:
    """How much of a wake-up `late_s` late was a pause: `busy_s` is the training thread's CPU
    time since the meter's last wake-up, of which up to `period_s` fell while the meter slept
    on time; the rest ran during the lateness, so that much of it was no pause."""
    ran = max(busy_s - period_s, 0.0)
    return max(late_s - ran - slack_s, 0.0)


class PauseMeter:
    """The pause meter's thread, started for the thread that calls `start` (the training one)."""

    def __init__(self, phase: Callable[[], int], *, phases: int) -> None:
        # Which of `phases` the training thread is in: where a pause it sees is charged.
        self.phase = phase
        # Seconds paused per phase since the last `take`.
        self._lost = [0.0] * phases
        # The meter adds while the training thread takes: one lock, taken only then.
        self._lock = threading.Lock()
        self._running = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start metering pauses of this process, with this thread as the training thread."""
        cpu = time.pthread_getcpuclockid(threading.get_ident())
        self._running = True
        self._thread = threading.Thread(
            target=self._run, args=(cpu,), name="trainbox-pauses", daemon=True
        )
        self._thread.start()

    def take(self) -> tuple[float, ...]:
        """Seconds paused per phase since the last call."""
        with self._lock:
            lost, self._lost = self._lost, [0.0] * len(self._lost)
        return tuple(lost)

    def stop(self) -> None:
        """Stop the thread (it ends within a period)."""
        self._running = False
        if self._thread is not None:
            self._thread.join(timeout=4 * PERIOD_S)
            self._thread = None

    def _run(self, cpu: int) -> None:
        try:
            busy = time.clock_gettime(cpu)
        except OSError:
            return
        deadline = time.perf_counter() + PERIOD_S
        while self._running:
            time.sleep(max(deadline - time.perf_counter(), 0.0))
            now = time.perf_counter()
            try:
                busy, before = time.clock_gettime(cpu), busy
            except OSError:  # the training thread has ended
                return
            late = now - deadline
            if late > SLACK_S:
                lost = paused_s(late_s=late, busy_s=busy - before, period_s=PERIOD_S,
                                slack_s=SLACK_S)  # fmt: skip
                if lost:
                    with self._lock:
                        self._lost[self.phase()] += lost
                # Count from now: one pause is counted once, not again by the next wake-ups.
                deadline = now
            deadline += PERIOD_S
