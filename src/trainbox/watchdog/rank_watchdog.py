"""The watchdog of one rank: its main thread marks what it does, a thread publishes that and
ends the process when the main thread has been stuck past the limit."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from trainbox.errors import StorageError
from trainbox.logs import log
from trainbox.storage import mirror
from trainbox.watchdog import evidence, store_keys
from trainbox.watchdog.transport import short_error
from trainbox.watchdog.verdicts import (
    STUCK,
    VICTIM,
    Beat,
    Blame,
    grace_s,
    interval_for,
    publish_every,
    silent_after,
    verdict,
)


class Watchdog:
    """The main thread marks what it does; a thread publishes that and judges a hang."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        host: str,
        timeout_s: float,
        store: Any,
        on_hang: Callable[[str], None],
        hosts_store: bool = False,
        evidence_dir: Path | None = None,
        on_verdict: Callable[[Blame], None] | None = None,
    ) -> None:
        self.rank, self.world_size, self.host = rank, world_size, host
        self.timeout_s = timeout_s
        # How often the thread looks at the main thread; it publishes every publish_s.
        self.interval_s = interval_for(timeout_s)
        self.publish_s = publish_every(timeout_s, world_size)
        self.store = store
        self.on_hang = on_hang
        # This process serves the store (rank 0 started by hand): the others need it to judge.
        self.hosts_store = hosts_store
        # Where this rank writes its stacks once the job is judged hung (None: nowhere).
        self.evidence_dir = evidence_dir
        # Told the job's one verdict once this rank gives up (the bad-node record hangs here).
        self.on_verdict = on_verdict
        # That verdict, once this rank has it: the error's hint names the node from it.
        self.verdict: Blame | None = None
        self._op, self._step, self._since = "start-up", 0, time.monotonic()
        self._fell = ""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainbox-watchdog", daemon=True)

    def mark(self, op: str, step: int) -> None:
        """The main thread enters `op` at `step` (cheap: two assignments and a clock read)."""
        self._op, self._step, self._since = op, step, time.monotonic()

    def __enter__(self) -> Watchdog:
        self._publish()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join()

    def explain(self, error: str, tb: TracebackType | None = None) -> str:
        """A collective failed in the main thread: say who failed first and what this rank did.

        `tb`: the failure's traceback, the main thread's stack in the evidence file.
        """
        here = f"rank {self.rank} failed in {self._op} at step {self._step}"
        # The thread would judge again once the limit passes: one verdict per rank.
        self._stopped.set()
        blame = self.conclude(VICTIM, main_tb=tb)
        return f"{here} ({short_error(error)}); {blame.text}"

    def conclude(self, fell: str, *, main_tb: TracebackType | None = None) -> Blame:
        """This rank gives up: say so in the store, then get the job's one verdict.

        The first few ranks to give up judge; the others wait for what they post. The store's
        host stays until the others hold their verdict (bounded), since they read it there.
        """
        self._fell = fell
        self._publish()
        place = store_keys.gave_up(self.store)
        # A peer that just died on another host still has a fresh beat: its silence, or every
        # other rank giving up, takes a bounded while to show.
        give_up = time.time() + silent_after(self.publish_s)
        blame = None
        if 0 < place <= store_keys.JUDGES:
            blame = self._blame_until(give_up)
        else:
            blame = store_keys.await_verdict(self.store, until=give_up + 2 * self.interval_s)
        blame = blame or self._blame_until(time.time())
        # Before this rank says it holds the verdict, after which the store's host may go.
        self._write_evidence(blame, main_tb)
        self.verdict = blame
        if self.on_verdict is not None:
            self.on_verdict(blame)
        store_keys.told(self.store)
        if self.hosts_store:
            # Every rank but the one that failed first: the rest are waiting to read here.
            stay = silent_after(self.publish_s) + self.timeout_s + grace_s(self.interval_s)
            store_keys.hold_store(
                self.store, expected=self.world_size - 1, until=time.time() + stay
            )
        return blame

    def blame_now(self) -> Blame:
        """The verdict on the beats as they are now (may not be final)."""
        beats = store_keys.read_all(self.store, self.world_size)
        beats[self.rank] = self._beat()
        return verdict(
            beats,
            now=time.time(),
            publish_s=self.publish_s,
            exited=_exited_here(beats, self.host),
        )

    def _blame_until(self, give_up: float) -> Blame:
        """Call blame_now every interval until the verdict is final or time is up; post it."""
        while True:
            if (found := store_keys.posted(self.store)) is not None:
                return found
            blame = self.blame_now()
            if blame.final or time.time() >= give_up:
                return store_keys.post(self.store, blame)
            time.sleep(min(self.interval_s, max(give_up - time.time(), 0.0)))

    def _run(self) -> None:
        # Judge a while after dist.timeout_s, so that a collective's own timeout (which the
        # main thread reports the same way) speaks first even on a loaded machine.
        limit = self.timeout_s + grace_s(self.interval_s)
        # Ranks spread their beats over the period, so that the store sees a steady rate.
        next_beat = time.monotonic() + self.publish_s * (1 + self.rank / self.world_size) / 2
        while not self._stopped.wait(self.interval_s):
            if time.monotonic() >= next_beat:
                self._publish()
                next_beat += self.publish_s
            stuck = time.monotonic() - self._since
            if stuck > limit:
                self._hang(stuck)
                return

    def _hang(self, stuck: float) -> None:
        limit_text = f"dist.timeout_s={self.timeout_s:g}"
        try:
            message = self._judge_hang(stuck, limit_text)
        except Exception as err:  # on_hang ends the process: nothing may stand in its way
            # A launcher killed with the pipe it read our stderr from makes every log line
            # raise BrokenPipeError; a rank left stuck would hold its devices for ever.
            message = (
                f"rank {self.rank} made no progress for {stuck:.0f} s ({limit_text}) in"
                f" {self._op} at step {self._step}; judging the hang failed:"
                f" {short_error(str(err))}"
            )
        self.on_hang(message)

    def _judge_hang(self, stuck: float, limit_text: str) -> str:
        log.error("hang", op=self._op, step=self._step, stuck_s=round(stuck, 1))
        blame = self.conclude(STUCK)
        if blame.rank == self.rank:
            return f"{blame.text} ({limit_text})"
        return (
            f"rank {self.rank} waited {stuck:.0f} s ({limit_text}) in {self._op}"
            f" at step {self._step}; {blame.text}"
        )

    def _write_evidence(self, blame: Blame, main_tb: TracebackType | None) -> None:
        """This rank's stacks into evidence_dir; a failure here never stops the exit."""
        if self.evidence_dir is None:
            return
        header = {
            "rank": self.rank,
            "world_size": self.world_size,
            "host": self.host,
            "pid": os.getpid(),
            "op": self._op,
            "step": self._step,
            "stuck_s": round(time.monotonic() - self._since, 1),
            "fell": self._fell,
            "blamed_rank": "" if blame.rank is None else blame.rank,
            "verdict": blame.text,
        }
        try:
            path = evidence.write(self.evidence_dir, header=header, main_tb=main_tb)
        except Exception as err:  # evidence is a courtesy: the exit must still happen
            log.warning("hang evidence not written", error=short_error(str(err)))
            return
        log.info("hang evidence", path=str(path))
        try:
            # run_dir=s3://: the evidence goes to the store before this process dies of the hang.
            mirror.push_if_stored(path)
        except StorageError as err:
            log.warning("hang evidence not uploaded", error=err.line())

    def _beat(self) -> Beat:
        return Beat(
            rank=self.rank,
            host=self.host,
            pid=os.getpid(),
            op=self._op,
            step=self._step,
            stuck_s=time.monotonic() - self._since,
            published=time.time(),
            fell=self._fell,
        )

    def _publish(self) -> None:
        try:
            store_keys.publish(self.store, self._beat())
        except Exception as err:  # the store going away is judged by progress, not by this
            log.debug("heartbeat not published", error=short_error(str(err)))


def _exited_here(beats: Mapping[int, Beat | None], host: str) -> frozenset[int]:
    gone = set()
    for rank, beat in beats.items():
        if beat is None or beat.host != host:
            continue
        try:
            # A killed worker stays a zombie until torchrun reaps it: exited all the same.
            if psutil.Process(beat.pid).status() == psutil.STATUS_ZOMBIE:
                gone.add(rank)
        except psutil.NoSuchProcess:
            gone.add(rank)
        except psutil.Error:
            pass  # alive, and someone else's
    return frozenset(gone)
