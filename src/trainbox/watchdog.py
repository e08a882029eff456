"""Hang detection: heartbeats through the job's TCPStore, and a verdict naming the stuck rank.

gloo has no watchdog of its own, and a rank stuck outside a collective (a data loader, a
deadlock) trips no timeout at all. Every rank's thread publishes what its main thread is doing;
a rank that has made no progress for `dist.timeout_s` ends itself with exit 4, naming the rank
that stopped first and the operation it was in.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import psutil

from trainbox.logs import log

PREFIX = "trainbox/heartbeat/"


@dataclass(frozen=True, kw_only=True, slots=True)
class Beat:
    """What one rank said it was doing, the last time its heartbeat thread published."""

    # The rank that published it.
    rank: int
    # Its host name, for the message.
    host: str
    # Its process id, so a peer on the same host can tell at once that it is gone.
    pid: int
    # The operation its main thread was in.
    op: str
    # The optimizer step it was at.
    step: int
    # Seconds its main thread had spent in `op` when this was published.
    stuck_s: float
    # Wall-clock time of publication (epoch seconds, the publisher's clock).
    published: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Blame:
    """The verdict: which rank, on what grounds, in words."""

    # The rank to blame; None when no heartbeat could be read at all.
    rank: int | None
    # exited (its process is gone) | silent (no heartbeat lately) | stuck | unknown
    kind: str
    # One sentence for the error line.
    text: str


def interval_for(timeout_s: float) -> float:
    """How often heartbeats go out: often enough to judge well within the timeout."""
    return min(max(timeout_s / 5, 0.5), 10.0)


def grace_s(interval_s: float) -> float:
    """How long past dist.timeout_s a rank waits before its own watchdog ends it."""
    return max(2 * interval_s, 5.0)


def silent_after(interval_s: float) -> float:
    """Three missed beats (plus clock skew between hosts) mean the publisher itself is gone."""
    return 3 * interval_s + 2.0


def verdict(
    beats: Mapping[int, Beat | None],
    *,
    now: float,
    interval_s: float,
    exited: frozenset[int] = frozenset(),
) -> Blame:
    """Which rank is to blame: a gone or silent one, else the one stuck longest.

    `exited`: ranks on this host whose process is known to have exited.
    """
    for rank in sorted(exited):
        beat = beats.get(rank)
        last = f"; its last heartbeat said {beat.op} at step {beat.step}" if beat else ""
        host = f" ({beat.host})" if beat else ""
        return Blame(
            rank=rank, kind="exited", text=f"rank {rank}{host} is gone: its process exited{last}"
        )
    silent = [
        (rank, beat)
        for rank, beat in sorted(beats.items())
        if beat is None or now - beat.published > silent_after(interval_s)
    ]
    if silent:
        rank, beat = silent[0]
        if beat is None:
            text = f"rank {rank} never sent a heartbeat (it died or cannot reach the store)"
            return Blame(rank=rank, kind="silent", text=text)
        return Blame(
            rank=rank,
            kind="silent",
            text=(
                f"rank {rank} ({beat.host}) stopped sending heartbeats {now - beat.published:.0f} s"
                f" ago, last seen in {beat.op} at step {beat.step} (its process died or its host is"
                " unreachable)"
            ),
        )
    known = [beat for beat in beats.values() if beat is not None]
    if not known:
        return Blame(rank=None, kind="unknown", text="no rank's heartbeat could be read")
    worst = max(known, key=lambda b: (b.stuck_s + now - b.published, -b.rank))
    stuck = worst.stuck_s + now - worst.published
    text = f"rank {worst.rank} ({worst.host}) made no progress for {stuck:.0f} s in {worst.op}"
    return Blame(rank=worst.rank, kind="stuck", text=f"{text} at step {worst.step}")


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
    ) -> None:
        self.rank, self.world_size, self.host = rank, world_size, host
        self.timeout_s = timeout_s
        self.interval_s = interval_for(timeout_s)
        self.store = store
        self.on_hang = on_hang
        self._op, self._step, self._since = "start-up", 0, time.monotonic()
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

    def explain(self, error: str) -> str:
        """A collective failed in the main thread: say who is to blame and what this rank did."""
        here = f"rank {self.rank} failed in {self._op} at step {self._step}"
        # A peer that just died still has a fresh heartbeat; on another host only its silence
        # gives it away, so give that a bounded while to show.
        give_up = time.monotonic() + silent_after(self.interval_s)
        blame = self.judge()
        peer_lost = "timed out" not in error.lower()
        while peer_lost and blame.kind == "stuck" and time.monotonic() < give_up:
            time.sleep(self.interval_s)
            blame = self.judge()
        return f"{here} ({_first_line(error)}); {blame.text}"

    def judge(self) -> Blame:
        """The verdict on the beats as they are now."""
        beats = self.beats()
        beats[self.rank] = self._beat()
        return verdict(
            beats,
            now=time.time(),
            interval_s=self.interval_s,
            exited=_exited_here(beats, self.host),
        )

    def beats(self) -> dict[int, Beat | None]:
        """Every rank's last heartbeat: None for one never sent; none at all if the store is gone.

        The store lives with rank 0 (or torchrun's agent): once it is gone nothing can be
        read, which says nothing about the other ranks, so they are left out, not blamed.
        """
        found: dict[int, Beat | None] = {}
        for rank in range(self.world_size):
            key = f"{PREFIX}{rank}"
            try:
                # check() first: get() on a key never written would block for the timeout.
                found[rank] = (
                    Beat(**json.loads(self.store.get(key))) if self.store.check([key]) else None
                )
            except Exception:  # the store went away (or answers garbage): nothing to read
                return {}
        return found

    def _run(self) -> None:
        # Judge a while after dist.timeout_s, so that a collective's own timeout (which the
        # main thread reports the same way) speaks first even on a loaded machine.
        limit = self.timeout_s + grace_s(self.interval_s)
        while not self._stopped.wait(self.interval_s):
            self._publish()
            stuck = time.monotonic() - self._since
            if stuck > limit:
                blame = self.judge()
                log.error("hang", op=self._op, step=self._step, stuck_s=round(stuck, 1))
                limit_text = f"dist.timeout_s={self.timeout_s:g}"
                if blame.rank == self.rank:
                    self.on_hang(f"{blame.text} ({limit_text})")
                else:
                    self.on_hang(
                        f"rank {self.rank} waited {stuck:.0f} s ({limit_text}) in {self._op}"
                        f" at step {self._step}; {blame.text}"
                    )
                return

    def _beat(self) -> Beat:
        return Beat(
            rank=self.rank,
            host=self.host,
            pid=os.getpid(),
            op=self._op,
            step=self._step,
            stuck_s=time.monotonic() - self._since,
            published=time.time(),
        )

    def _publish(self) -> None:
        try:
            self.store.set(f"{PREFIX}{self.rank}", json.dumps(asdict(self._beat())))
        except Exception as err:  # the store going away is judged by progress, not by this
            log.debug("heartbeat not published", error=_first_line(str(err)))


# What gloo and NCCL say when a peer is gone or a collective timed out (they raise plain
# RuntimeError from inside DDP's backward, not torch.distributed.DistError).
_COMM_FAILURES = (
    "gloo",
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
    "NCCL",
    "Broken pipe",
    "caused pair closure",
)


def is_comm_failure(error: BaseException) -> bool:
    """Whether an exception from a training step is the transport failing, not user code."""
    import torch.distributed as torch_dist

    return isinstance(error, torch_dist.DistError) or (
        isinstance(error, RuntimeError) and any(s in str(error) for s in _COMM_FAILURES)
    )


def connect(addr: str, port: int, *, world_size: int, timeout_s: float, attempt: int) -> Any:
    """A store client of its own, with a short timeout, so a dead master cannot block it long.

    Keys are per restart attempt: a dead worker's last beat must not speak for its successor.
    """
    import torch.distributed as torch_dist

    if world_size == 1:
        # No peers to hear it (and no master port: one process picks its own).
        return torch_dist.HashStore()
    client = torch_dist.TCPStore(
        addr,
        port,
        is_master=False,
        timeout=timedelta(seconds=min(timeout_s, 5.0)),
        wait_for_workers=False,
    )
    return torch_dist.PrefixStore(f"attempt-{attempt}", client)


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


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no message"
    return line if len(line) < 300 else line[:297] + "..."
