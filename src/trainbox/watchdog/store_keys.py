"""The watchdog's keys in the job's store, read and written in O(1) requests per rank.

One key per rank holds its last beat. Once a hang or a lost peer is judged, the first few
ranks to give up judge for everyone (one batched read each); the verdict they reach goes
into one key, first writer wins, which every other rank waits on with one request.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from trainbox.watchdog.verdicts import Beat, Blame

PREFIX = "trainbox/heartbeat/"
# Counts the ranks that gave up; the first JUDGES of them judge.
FELL = "trainbox/fell"
# Counts the ranks that hold their verdict: the store's host waits for them before it exits.
TOLD = "trainbox/told"
VERDICT = "trainbox/verdict"
JUDGES = 3


def publish(store: Any, beat: Beat) -> None:
    """This rank's beat (one request)."""
    store.set(f"{PREFIX}{beat.rank}", json.dumps(asdict(beat)))


def read_all(store: Any, world_size: int) -> dict[int, Beat | None]:
    """Every rank's last beat (two requests); None for one never sent.

    The store lives with rank 0 (or torchrun's agent): once it is gone nothing can be read,
    which says nothing about the other ranks, so none is returned.
    """
    keys = [f"{PREFIX}{rank}" for rank in range(world_size)]
    try:
        # multi_get would block on a key never written: only when all exist (the usual case).
        if store.check(keys):
            return {rank: _beat(raw) for rank, raw in enumerate(store.multi_get(keys))}
        return {rank: _beat(store.get(key)) if store.check([key]) else None
                for rank, key in enumerate(keys)}  # fmt: skip
    except Exception:  # the store went away (or answers garbage): nothing to read
        return {}


def gave_up(store: Any) -> int:
    """Count this rank among those that gave up; its place (1 = first). 0: no store."""
    try:
        return int(store.add(FELL, 1))
    except Exception:
        return 0


def post(store: Any, blame: Blame) -> Blame:
    """Offer a verdict; the one every rank gets (the first posted) is returned."""
    mine = json.dumps(
        {"rank": blame.rank, "kind": blame.kind, "text": blame.text, "host": blame.host}
    )
    try:
        return _blame(store.compare_set(VERDICT, "", mine))
    except Exception:
        return blame


def await_verdict(store: Any, *, until: float) -> Blame | None:
    """The verdict once a judge posts it (one blocking request); None by `until` or no store."""
    try:
        store.wait([VERDICT], timedelta(seconds=max(until - time.time(), 0.01)))
        return _blame(store.get(VERDICT))
    except Exception:
        return None


def posted(store: Any) -> Blame | None:
    """The verdict if one is posted already (one request)."""
    try:
        return _blame(store.get(VERDICT)) if store.check([VERDICT]) else None
    except Exception:
        return None


def told(store: Any) -> int:
    """Count this rank among those holding their verdict; how many do now."""
    try:
        return int(store.add(TOLD, 1))
    except Exception:
        return 0


def hold_store(store: Any, *, expected: int, until: float, poll_s: float = 0.2) -> None:
    """On the store's host: stay until `expected` ranks hold their verdict, or `until`."""
    while time.time() < until:
        try:
            if int(store.add(TOLD, 0)) >= expected:
                return
        except Exception:
            return
        time.sleep(poll_s)


def _beat(raw: bytes) -> Beat:
    return Beat(**json.loads(raw))


def _blame(raw: bytes) -> Blame:
    fields = json.loads(raw)
    return Blame(
        rank=fields["rank"], kind=fields["kind"], text=fields["text"], host=fields.get("host", "")
    )
