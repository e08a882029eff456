"""Pure decisions: how often to beat, when to judge, and which rank failed first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Heartbeat writes per second the whole job may send to its one store, however many ranks.
STORE_BEATS_PER_S = 150.0
# fell: what a rank that gave up said of itself. A victim lost a peer or timed out waiting on
# one; a rank whose own watchdog fired may be the culprit or merely waiting on it.
VICTIM = "lost-peer"
STUCK = "stuck"


@dataclass(frozen=True, kw_only=True, slots=True)
class Beat:
    """What one rank said it was doing, the last time it published."""

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
    # "" while it runs; VICTIM or STUCK once it gave up (its last beat).
    fell: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Blame:
    """The verdict: which rank, on what grounds, in words."""

    # The rank to blame; None when no heartbeat could be read at all.
    rank: int | None
    # exited (its process is gone) | silent (no heartbeat lately) | stuck | unknown
    kind: str
    # One sentence for the error line.
    text: str
    # Whether more beats cannot change it: every judge reaches the same one.
    final: bool = True
    # The blamed rank's host, as its heartbeat named it ("" when none was read).
    host: str = ""

    @property
    def died(self) -> bool:
        """Whether the blamed rank's process is gone (not merely stuck) and its host known."""
        return self.kind in ("exited", "silent") and bool(self.host)


def interval_for(timeout_s: float) -> float:
    """How often the watchdog looks at its own main thread: well within the timeout."""
    return min(max(timeout_s / 5, 0.5), 10.0)


def publish_every(timeout_s: float, world_size: int) -> float:
    """How often a rank publishes: stretched with the job so the store sees a bounded rate."""
    return max(interval_for(timeout_s), world_size / STORE_BEATS_PER_S)


def grace_s(interval_s: float) -> float:
    """How long past dist.timeout_s a rank waits before its own watchdog ends it."""
    return max(2 * interval_s, 5.0)


def silent_after(publish_s: float) -> float:
    """Three missed beats (plus clock skew between hosts) mean the publisher itself is gone."""
    return 3 * publish_s + 2.0


def verdict(
    beats: Mapping[int, Beat | None],
    *,
    now: float,
    publish_s: float,
    exited: frozenset[int] = frozenset(),
) -> Blame:
    """The rank that failed first: gone without a word, else the one left standing or stuck
    longest. Ranks that gave up as victims are never blamed while another rank can be.

    `exited`: ranks on this host whose process is known to have exited.
    """
    suspects = {rank: beat for rank, beat in beats.items() if beat is None or beat.fell != VICTIM}
    gone = [
        (beat.published if beat else float("-inf"), rank)
        for rank, beat in suspects.items()
        if (beat is None or not beat.fell)
        and (rank in exited or beat is None or now - beat.published > silent_after(publish_s))
    ]
    if gone:
        _, rank = min(gone)
        return _gone(rank, beats.get(rank), now=now, exited=rank in exited)
    running = [rank for rank, beat in suspects.items() if beat is not None and not beat.fell]
    # Every rank but one gave up, or all of them did: nothing still to come can change it.
    # Unless the one still standing last beat before any stall: it may have died since (a pod
    # killed on another node looks just so), and only its silence, a few beats on, tells.
    lone = [suspects[rank] for rank in running]
    unproven = len(lone) == 1 and lone[0] is not None and lone[0].stuck_s < publish_s
    final = len(running) <= 1 and (len(running) == 1 or bool(beats)) and not unproven
    pool = [beat for beat in suspects.values() if beat is not None] or [
        beat for beat in beats.values() if beat is not None
    ]
    if not pool:
        return Blame(rank=None, kind="unknown", text="no rank's heartbeat could be read")
    # Stuck longest = last progress earliest; a tie blames the lowest rank.
    worst = min(pool, key=lambda b: (b.published - b.stuck_s, b.rank))
    where = f"rank {worst.rank} ({worst.host})"
    if worst.stuck_s < publish_s:
        # Beats come every publish_s, progress or not: a beat that saw no stall proves none, and
        # the rank may have moved on since (it may also have died before its next beat).
        age = now - worst.published
        text = f"{where} last reported {worst.op} at step {worst.step}, {age:.0f} s ago,"
        return Blame(
            rank=worst.rank,
            kind="stuck",
            text=f"{text} and no failure since",
            final=final,
            host=worst.host,
        )
    stuck = now - (worst.published - worst.stuck_s)
    text = f"{where} made no progress for {stuck:.0f} s in {worst.op} at step {worst.step}"
    return Blame(rank=worst.rank, kind="stuck", text=text, final=final, host=worst.host)


def _gone(rank: int, beat: Beat | None, *, now: float, exited: bool) -> Blame:
    if exited and beat is not None:
        text = f"rank {rank} ({beat.host}) is gone: its process exited; its last heartbeat said"
        text = f"{text} {beat.op} at step {beat.step}"
        return Blame(rank=rank, kind="exited", text=text, host=beat.host)
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
        host=beat.host,
    )
