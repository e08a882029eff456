"""Tests only: TRAINBOX_PREDICT_KILL makes rank 0 SIGKILL itself at a point of `predict`.

    parts=N   right after the N-th part file this run writes is durable
    merge     once the merged temp file holds the header and the first part

Unset (or empty), nothing is checked. A malformed value exits 2.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from trainbox.errors import UsageError

VARIABLE = "TRAINBOX_PREDICT_KILL"


@dataclass(frozen=True, kw_only=True, slots=True)
class KillPoint:
    """Where rank 0 of a prediction run dies (tests only)."""

    # After this many part files of this run; None: not at a part.
    parts: int | None = None
    # In the middle of writing the merged output.
    merge: bool = False


def parse(env: Mapping[str, str]) -> KillPoint:
    """The kill point TRAINBOX_PREDICT_KILL names; none when it is unset."""
    text = env.get(VARIABLE, "").strip()
    if not text:
        return KillPoint()
    if text == "merge":
        return KillPoint(merge=True)
    key, _, value = text.partition("=")
    if key == "parts" and value.isascii() and value.isdigit() and int(value) > 0:
        return KillPoint(parts=int(value))
    raise UsageError(
        f"{VARIABLE}={text!r} is neither parts=N (N > 0) nor merge",
        hint=f"{VARIABLE} is for tests; unset it for real runs",
    )


def die() -> NoReturn:
    """SIGKILL this process, as the OOM killer or a lost node would: no cleanup runs."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(137)  # not reached
