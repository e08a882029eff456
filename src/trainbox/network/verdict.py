"""Which links and nodes are slow, from link bandwidths alone (pure).

The yardstick is not the median link: in a ring of 3 nodes a slow node slows 2 of the 3
links, and the median would be a slow one. Instead each ring position keeps its faster link,
and the yardstick is the median of those: a slow node's neighbours still have one healthy link
each, so up to nearly half the positions may be bad before the yardstick moves.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Cut-off: a link below this fraction of the yardstick is slow.
DEFAULT_MIN_FRACTION = 0.5
# The yardstick travels as a histogram: log-spaced bins, 16 per doubling (about 4.4% wide),
# from 1 KiB/s to 16 PiB/s; fixed size, so every rank sends the same few KiB at any scale.
BINS_PER_OCTAVE = 16
LOWEST = 1024.0
OCTAVES = 44
BINS = BINS_PER_OCTAVE * OCTAVES
HINT = (
    "check the named host's NIC, cable and switch port (ethtool -S, ibstat, dmesg) or leave it"
    " out of the job, then rerun `trainbox doctor --network`; --network-min-fraction sets the"
    " cut-off"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """One measured link of a ring: source position -> source position + 1."""

    # The ring it belongs to (a local rank; 0 in a ring of ranks).
    lane: int
    # Ring positions at its two ends.
    source: int
    target: int
    # Host names (or "rank R on HOST" in a ring of ranks) at its two ends.
    source_name: str
    target_name: str
    # Bytes per second each way, while both ends sent at once.
    bandwidth: float


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkVerdict:
    """The network check's judgement."""

    # Bytes per second a healthy link is expected to reach (median of each position's best).
    reference: float | None
    # Bytes per second below which a link is slow.
    threshold: float | None
    # The slow links known, slowest first (all of them, or the worst few at scale).
    slow_links: tuple[Link, ...]
    # How many links are slow in all (may exceed len(slow_links)).
    slow_count: int
    # Names of nodes (or ranks) whose both ring links are slow.
    slow_nodes: tuple[str, ...]
    # One line for a person: what is slow, or that nothing is.
    message: str

    @property
    def ok(self) -> bool:
        """Whether no link is slow."""
        return self.slow_count == 0


def reference_bandwidth(links: Sequence[Link]) -> float | None:
    """The median over ring positions of each position's faster link; None without links.

    The upper median: with as many bad positions as good ones (2 nodes, one bad lane of two)
    the yardstick is the good one.
    """
    best: dict[tuple[int, int], float] = {}
    for link in links:
        for end in ((link.lane, link.source), (link.lane, link.target)):
            best[end] = max(best.get(end, 0.0), link.bandwidth)
    return statistics.median_high(best.values()) if best else None


def find_slow_links(
    links: Sequence[Link],
    *,
    reference: float | None,
    ring_size: int,
    min_fraction: float,
    slow_count: int | None = None,
) -> NetworkVerdict:
    """Slow links (below `min_fraction` of `reference`) and slow nodes (both ring links slow).

    `links` may be only the slowest few (at scale); then `slow_count` says how many there are.
    """
    if reference is None:
        return NetworkVerdict(
            reference=None, threshold=None, slow_links=(), slow_count=0, slow_nodes=(),
            message=f"no link to measure: the ring has {ring_size} position(s)",
        )  # fmt: skip
    threshold = min_fraction * reference
    slow = tuple(sorted((k for k in links if k.bandwidth < threshold), key=_by_speed))
    nodes = _slow_nodes(slow) if ring_size >= 3 else ()
    count = len(slow) if slow_count is None else max(slow_count, len(slow))
    return NetworkVerdict(
        reference=reference,
        threshold=threshold,
        slow_links=slow,
        slow_count=count,
        slow_nodes=nodes,
        message=_message(slow, count, nodes, ring_size, min_fraction, reference),
    )


def _by_speed(link: Link) -> tuple[float, int, int]:
    return (link.bandwidth, link.lane, link.source)


def _slow_nodes(slow: Sequence[Link]) -> tuple[str, ...]:
    """Positions whose incoming and outgoing links of one lane are both slow, by name."""
    outgoing = {(k.lane, k.source): k for k in slow}
    incoming = {(k.lane, k.target) for k in slow}
    names = [link.source_name for end, link in outgoing.items() if end in incoming]
    return tuple(dict.fromkeys(sorted(names)))


def _message(
    slow: Sequence[Link],
    count: int,
    nodes: Sequence[str],
    ring_size: int,
    min_fraction: float,
    reference: float,
) -> str:
    cut = f"below {min_fraction:.0%} of {format_rate(reference)}"
    if nodes:
        return f"slow node: {', '.join(nodes)} (both of its ring links are {cut})"
    if not slow:
        return f"all links within {min_fraction:.0%} of {format_rate(reference)}"
    shown = ", ".join(
        f"{k.source_name} <-> {k.target_name} {format_rate(k.bandwidth)}" for k in slow
    )
    more = f" and {count - len(slow)} more" if count > len(slow) else ""
    line = f"slow link: {shown}{more} ({cut})"
    if ring_size == 2:
        line += "; with 2 nodes a slow node cannot be told from a slow link"
    return line


def format_rate(bytes_per_s: float) -> str:
    """Bytes per second the way nccl-tests prints them: decimal GB/s (MB/s when small)."""
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.2f} GB/s"
    return f"{bytes_per_s / 1e6:.2f} MB/s"


def histogram_bin(bytes_per_s: float) -> int:
    """The histogram bin that holds `bytes_per_s` (clamped to the first and last)."""
    if bytes_per_s <= LOWEST:
        return 0
    return min(BINS - 1, int(math.log2(bytes_per_s / LOWEST) * BINS_PER_OCTAVE))


def histogram_median(counts: Sequence[float]) -> float | None:
    """The upper median of the values counted, as its bin's geometric centre; None if empty."""
    total = int(sum(counts))
    if total == 0:
        return None
    wanted = total // 2
    seen = 0
    for index, count in enumerate(counts):
        seen += int(count)
        if seen > wanted:
            return LOWEST * 2 ** ((index + 0.5) / BINS_PER_OCTAVE)
    raise AssertionError("unreachable: the counts sum to total")
