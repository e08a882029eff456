"""Hang detection: heartbeats through the job's TCPStore, and a verdict naming the rank that
failed first.

gloo has no watchdog of its own, and a rank stuck outside a collective (a data loader, a
deadlock) trips no timeout at all. Every rank's thread publishes what its main thread is doing;
a rank that has made no progress for `dist.timeout_s` ends itself with exit 4, naming the rank
that stopped first and the operation it was in. The store sees O(1) requests per rank:
verdicts.py decides, store_keys.py holds the keys, rank_watchdog.py is the thread, transport.py
the client; evidence.py writes each rank's stacks to run_dir/hang/ once the job is judged hung
and hang_report.py reads them back.
"""

from trainbox.watchdog.evidence import EVIDENCE_DIR
from trainbox.watchdog.rank_watchdog import Watchdog
from trainbox.watchdog.store_keys import PREFIX
from trainbox.watchdog.transport import connect, is_comm_failure, short_error
from trainbox.watchdog.verdicts import (
    Beat,
    Blame,
    grace_s,
    interval_for,
    publish_every,
    silent_after,
    verdict,
)

__all__ = [
    "EVIDENCE_DIR",
    "PREFIX",
    "Beat",
    "Blame",
    "Watchdog",
    "connect",
    "grace_s",
    "interval_for",
    "is_comm_failure",
    "publish_every",
    "short_error",
    "silent_after",
    "verdict",
]
