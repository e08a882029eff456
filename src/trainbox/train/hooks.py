"""What runs around the training loop's steps besides training: the hang watchdog's marks, the
stop vote (signals, the Slurm deadline) and test-only fault injection, behind one interface.

The loop calls these methods and nothing else of them, so it knows neither tests nor signals.
"""

from __future__ import annotations

from collections.abc import Callable

from trainbox.faults import Injector
from trainbox.preempt import Requests
from trainbox.train import stopping

# Tells the hang watchdog what the main thread is doing: (operation, step).
Mark = Callable[[str, int], None]


def _unwatched(what: str, step: int) -> None:
    del what, step


class Hooks:
    """Watchdog marks, the stop vote and faults for one run; inert parts by default."""

    def __init__(
        self,
        *,
        requests: Requests | None = None,
        deadline_at: float | None = None,
        mark: Mark = _unwatched,
        faults: Injector | None = None,
    ) -> None:
        # Stop signals this process has received (the CLI or api.Trainer installs handlers).
        self.requests = requests or Requests()
        # Epoch seconds after which to stop and checkpoint (Slurm's end time less the margin).
        self.deadline_at = deadline_at
        self.mark: Mark = mark
        self.faults = faults or Injector((), rank=0)
        # Whether any fault is armed on this rank: without, the per-step calls skip the injector.
        self._faulty = bool(self.faults.faults)
        self.vote: stopping.Vote | None = None

    def start(self, step: int, *, timeout_s: float, every_s: float) -> str:
        """Start the stop vote, one every `every_s` (collective: its group is made here); a stop
        asked for during start-up is returned at once, before the first step."""
        self.vote = stopping.Vote(
            self.requests,
            deadline_at=self.deadline_at,
            group=stopping.group(timeout_s),
            start_step=step,
            every_s=every_s,
            mark=self.mark,
        )
        return self.vote.start()

    def before_step(self, step: int) -> None:
        """As the loop starts waiting for step `step`'s data."""
        self.mark("data loading", step)
        if self._faulty:
            self.faults.before_step(step)

    def after_step(self, step: int) -> None:
        """Right after the optimizer step `step`."""
        if self._faulty:
            self.faults.after_step(step)

    def stop_after(self, step: int) -> str:
        """Once step `step` is done (logged, evaluated, saved): the agreed reason to stop
        now, the same on every rank ('' to go on)."""
        return self.vote.after_step(step) if self.vote is not None else ""

    def at_save(self, point: str, step: int) -> None:
        """As the checkpoint of `step` passes `point` (faults.SAVE_POINTS)."""
        self.faults.at_save(point, step)

    def finish(self, *, timeout_s: float) -> None:
        """The loop ended normally: leave the vote once every rank has."""
        if self.vote is not None:
            self.vote.finish(timeout_s=timeout_s)

    def close(self) -> None:
        """On the way out, also after an error: the vote's thread ends before the process."""
        if self.vote is not None:
            self.vote.abort(timeout_s=self.vote.every_s + 5)
