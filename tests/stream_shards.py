"""Small tar shard sets for real training runs: shards of uneven sizes, with a manifest."""

from __future__ import annotations

import io
import tarfile
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


def write_tar(path: Path, members: list[tuple[str, bytes] | tarfile.TarInfo]) -> Path:
    """A plain tar of `members` in the order given: (name, data) files, or TarInfo entries
    (links, folders) as they stand; for layouts write_shard never makes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            name, data = member
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def webdataset(first: int, count: int) -> list[tuple[str, dict[str, bytes]]]:
    """Samples named as WebDataset writers often name them: KEY.input.npy and KEY.label.cls."""
    samples = []
    for number in range(first, first + count):
        members = {
            "input.npy": npy(np.full(2, number, np.float32)),
            "label.cls": str(number % 3).encode(),
        }
        samples.append((f"{number:06d}", members))
    return samples
