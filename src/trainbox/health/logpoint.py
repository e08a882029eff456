"""The log point's protocol: what every rank adds to its all-reduces to see the whole job.

A participant (the straggler detector, GPU telemetry) hands StepMetrics a LogPointShare of fixed
size: values to SUM across ranks (histogram counts, totals) and values to MAX (maxima; minima
negated). The log point concatenates every participant's share into its one SUM all-reduce and
one MAX all-reduce, so what a participant learns costs O(1) bytes per rank, whatever the world
size, and no rank gathers.

Histograms (health/histogram.py) use fixed bins, so counts from every rank add up and every
rank reads the same median from the sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, kw_only=True, slots=True)
class LogPointShare:
    """A rank's contribution to a log point's all-reduces."""

    # All-reduced with SUM (histogram counts, totals).
    sums: tuple[float, ...]
    # All-reduced with MAX (minimums go in negated).
    maxes: tuple[float, ...]


class LogPointParticipant(Protocol):
    """Something that takes part in every log point: it shares fixed-size numbers and turns the
    all-reduced whole into metrics records."""

    def share(self) -> LogPointShare:
        """This rank's numbers for this log window (the same sizes on every rank, every time)."""
        ...

    def records(self, whole: LogPointShare, *, step: int) -> list[dict[str, Any]]:
        """Records for metrics.jsonl from the all-reduced `whole` (rank 0 writes them).

        A record of kind "train" adds its fields to the log point's train line. Every rank
        calls it with the same `whole`, so a participant may take a collective decision here.
        """
        ...


def split(whole: LogPointShare, like: Sequence[LogPointShare]) -> list[LogPointShare]:
    """Cut the concatenation of shares shaped `like` back into one LogPointShare each."""
    out, at_sum, at_max = [], 0, 0
    for shape in like:
        sums = whole.sums[at_sum : at_sum + len(shape.sums)]
        maxes = whole.maxes[at_max : at_max + len(shape.maxes)]
        out.append(LogPointShare(sums=sums, maxes=maxes))
        at_sum, at_max = at_sum + len(shape.sums), at_max + len(shape.maxes)
    return out


# A rank and a duration packed into one number, so that one MAX names the rank with the largest
# duration: whole microseconds above, rank + 1 below (0 means no rank). float64 holds it exactly
# up to 1,000 s and 4 M ranks.
RANK_BITS = 22
MAX_US = 2 ** (53 - RANK_BITS) - 1


def pack(seconds: float, rank: int) -> float:
    """(duration, rank) as one number whose maximum is the rank with the longest duration."""
    micros = min(max(round(seconds * 1e6), 0), MAX_US)
    return float(micros * 2**RANK_BITS + rank + 1)


def unpack(packed: float) -> tuple[float, int] | None:
    """(duration in seconds, rank) from pack(), or None for no rank."""
    whole = int(packed)
    rank = whole % 2**RANK_BITS - 1
    if rank < 0:
        return None
    return (whole >> RANK_BITS) / 1e6, rank
