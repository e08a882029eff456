"""The sweep's sizes and nccl-tests' bandwidth arithmetic (pure).

Definitions from NVIDIA/nccl-tests doc/PERFORMANCE.md: algorithm bandwidth is bytes / time, and
an all-reduce's bus bandwidth is algbw * 2(n-1)/n, the share of the data each rank must move
over its slowest link in a ring all-reduce; busbw is what compares with the hardware's peak.
"""

from __future__ import annotations

from dataclasses import dataclass

# The sweep starts here and grows by STEP until it passes the largest size asked for.
SMALLEST_BYTES = 1024
STEP = 4
# The default largest all-reduce: big enough to reach a fabric's bandwidth plateau.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# float32 elements: every size is a whole number of them.
ELEMENT_BYTES = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepRow:
    """One size of the all-reduce sweep, timed as the slowest rank saw it."""

    # Bytes all-reduced per call (the buffer size, as nccl-tests' "size").
    size: int
    # Seconds per all-reduce: the mean over the timed calls, the maximum over ranks.
    seconds: float
    # Algorithm bandwidth, bytes per second.
    algbw: float
    # Bus bandwidth, bytes per second.
    busbw: float


def sweep_sizes(max_bytes: int) -> list[int]:
    """1 KiB, 4 KiB, 16 KiB, ... up to `max_bytes`, which is always the last size."""
    if max_bytes < SMALLEST_BYTES:
        raise ValueError(f"max_bytes {max_bytes} is below {SMALLEST_BYTES}")
    sizes = []
    size = SMALLEST_BYTES
    while size < max_bytes:
        sizes.append(size)
        size *= STEP
    last = max_bytes - max_bytes % ELEMENT_BYTES
    return [*sizes, last] if not sizes or sizes[-1] != last else sizes


def algbw(size: int, seconds: float) -> float:
    """Bytes per second of one operation on `size` bytes that took `seconds`."""
    return size / seconds


def allreduce_busbw(algorithm_bandwidth: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n (0 for one rank: nothing moves)."""
    return algorithm_bandwidth * 2 * (world_size - 1) / world_size


def row(size: int, seconds: float, world_size: int) -> SweepRow:
    """One sweep row from the slowest rank's time."""
    bandwidth = algbw(size, seconds)
    return SweepRow(
        size=size,
        seconds=seconds,
        algbw=bandwidth,
        busbw=allreduce_busbw(bandwidth, world_size),
    )
