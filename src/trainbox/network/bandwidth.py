"""The sweep's sizes and nccl-tests' bandwidth arithmetic (pure).

Definitions from NVIDIA/nccl-tests doc/PERFORMANCE.md: algorithm bandwidth is S / time, where S
is the operation's whole buffer (for all-gather the gathered output, for reduce-scatter the
input before it is scattered), and bus bandwidth is algbw times a factor per collective: 2(n-1)/n
for all-reduce, (n-1)/n for all-gather and reduce-scatter. It is the share of S each rank must
move over its slowest link in a ring; busbw is what compares with the hardware's peak. This file
is the one home of those formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# The sweep starts here and grows by STEP until it passes the largest size asked for.
SMALLEST_BYTES = 1024
STEP = 4
# The default largest buffer of the sweeps: big enough to reach a fabric's bandwidth plateau.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# float32 elements: every size is a whole number of them.
ELEMENT_BYTES = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepRow:
    """One size of one collective's sweep, timed as the slowest rank saw it."""

    # Bytes per call: the whole buffer S, as nccl-tests' "size" (all-gather: the gathered output;
    # reduce-scatter: the input before scattering; each rank's shard is S / n).
    size: int
    # Seconds per call: the mean over the timed calls, the maximum over ranks.
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


def allgather_busbw(algorithm_bandwidth: float, world_size: int) -> float:
    """nccl-tests' all-gather bus bandwidth: algbw * (n-1)/n, algbw of the gathered size."""
    return algorithm_bandwidth * (world_size - 1) / world_size


def reduce_scatter_busbw(algorithm_bandwidth: float, world_size: int) -> float:
    """nccl-tests' reduce-scatter bus bandwidth: algbw * (n-1)/n, algbw of the input's size."""
    return algorithm_bandwidth * (world_size - 1) / world_size


ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
# Each measured collective's bus bandwidth, in the order the table prints them.
BUSBW: dict[str, Callable[[float, int], float]] = {
    ALL_REDUCE: allreduce_busbw,
    ALL_GATHER: allgather_busbw,
    REDUCE_SCATTER: reduce_scatter_busbw,
}
COLLECTIVES = tuple(BUSBW)


def shard_sizes(sizes: list[int], world_size: int) -> list[int]:
    """All-gather and reduce-scatter sizes from the sweep's: each rounded down to a whole float32
    per rank (S = n * shard), never above the size asked for; too small for n ranks is dropped."""
    unit = world_size * ELEMENT_BYTES
    return sorted({size - size % unit for size in sizes if size >= unit})


def row(size: int, seconds: float, world_size: int, collective: str = ALL_REDUCE) -> SweepRow:
    """One sweep row of `collective` from the slowest rank's time."""
    bandwidth = algbw(size, seconds)
    return SweepRow(
        size=size,
        seconds=seconds,
        algbw=bandwidth,
        busbw=BUSBW[collective](bandwidth, world_size),
    )
