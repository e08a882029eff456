"""Small tar shard sets for real training runs: shards of uneven sizes, with a manifest."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from trainbox.streams.shards import Shard, write_manifest, write_shard


def npy(array: np.ndarray) -> bytes:
    """`array` as the bytes of a .npy file."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def numbered(count: int) -> list[tuple[str, dict[str, bytes]]]:
    """Samples whose input is [i, i] and whose class is i % 3."""
    return [
        (f"s{i:04d}", {"npy": npy(np.full(2, i, np.float32)), "cls": str(i % 3).encode()})
        for i in range(count)
    ]


def write_uneven(directory: Path, sizes: tuple[int, ...], seed: int) -> Path:
    """Shards of `sizes` samples: a point in the plane and its quadrant-ish class."""
    rng = np.random.default_rng(seed)
    shards, number = [], 0
    directory.mkdir(parents=True)
    for index, size in enumerate(sizes):
        samples = []
        for _ in range(size):
            point = rng.normal(size=2).astype(np.float32)
            label = int(point[0] > 0) + int(point[1] > 0)
            samples.append((f"s{number:06d}", {"npy": npy(point), "cls": str(label).encode()}))
            number += 1
        path = directory / f"shard-{index:06d}.tar"
        write_shard(path, samples)
        shards.append(Shard(location=str(path), samples=size, size=path.stat().st_size))
    write_manifest(directory, shards)
    return directory
