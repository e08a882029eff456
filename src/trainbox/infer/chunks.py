"""How prediction work is cut up: fixed chunks of input indices, dealt to ranks in rounds.

Chunks depend on the dataset and the chunk size only, never on the world size, so parts written
by a killed run of N ranks are reused by a rerun of M. Pure (no torch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainbox.version import __version__

# Bumped when the part files' contents change meaning (2: the data's target column).
MANIFEST_VERSION = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class Chunk:
    """A run of consecutive input indices whose rows form one part file."""

    # Position in the output: parts are merged in this order.
    number: int
    # First input index, and one past the last.
    start: int
    stop: int

    @property
    def rows(self) -> int:
        """How many rows its part holds."""
        return self.stop - self.start


def plan(size: int, chunk_size: int) -> list[Chunk]:
    """The chunks covering indices 0..size-1 in order."""
    return [
        Chunk(number=number, start=start, stop=min(start + chunk_size, size))
        for number, start in enumerate(range(0, size, chunk_size))
    ]


def rounds(pending: Sequence[int], *, world_size: int) -> list[list[int | None]]:
    """Round r gives rank k chunk pending[r * world_size + k] (None: nothing left for it)."""
    dealt: list[list[int | None]] = []
    for first in range(0, len(pending), world_size):
        batch: list[int | None] = list(pending[first : first + world_size])
        dealt.append(batch + [None] * (world_size - len(batch)))
    return dealt


def manifest(
    *,
    checkpoint_sha256: str,
    split: str,
    size: int,
    chunk_size: int,
    output_format: str,
    loss: str,
    batch_size: int,
    amp: str,
    data: Mapping[str, Any],
    predict_step: str = "",
) -> dict[str, Any]:
    """What parts were computed from; a rerun reuses them only if everything here is equal.

    Beyond the weights, split and size: the data config (same size, other points), the chunk
    and batch sizes (which rows share a forward pass), the format, loss and precision, and
    the user's predict step (empty: the built-in columns).
    """
    return {
        "version": MANIFEST_VERSION,
        "trainbox": __version__,
        "checkpoint_sha256": checkpoint_sha256,
        "split": split,
        "size": size,
        "chunk_size": chunk_size,
        "format": output_format,
        "loss": loss,
        "batch_size": batch_size,
        "amp": amp,
        "data": dict(data),
        "predict_step": predict_step,
    }


def differences(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The manifest keys whose values differ (for the log line when parts are discarded)."""
    return sorted(key for key in found.keys() | wanted.keys() if found.get(key) != wanted.get(key))
