"""Tar shards (the WebDataset layout) as a data source: a manifest per split, streamed in
training by plan (equal steps on every rank, an exact resumable position)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainbox.config.factories import resolve
from trainbox.streams.dataset import ON_CORRUPT, ShardStream
from trainbox.streams.decode import pair
from trainbox.streams.shards import read_manifest
from trainbox.tasks.problems import Problems
from trainbox.train.data.contract import Datasets

HINT = "fix data.args (train, val, decode, shuffle_buffer, lanes, on_corrupt)"


def data(
    *,
    train: str,
    val: str | None = None,
    decode: str | None = None,
    shuffle_buffer: int = 1,
    lanes: int = 0,
    on_corrupt: str = "error",
) -> Datasets:
    """Streams of the manifests `train` and `val` (a manifest.json or the folder holding it)."""
    problems = Problems()
    for name, value, least in (("shuffle_buffer", shuffle_buffer, 1), ("lanes", lanes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            problems.add(f"data.args.{name}={value!r} must be a whole number, at least {least}")
    if on_corrupt not in ON_CORRUPT:
        problems.add(f"data.args.on_corrupt={on_corrupt!r} must be one of {', '.join(ON_CORRUPT)}")
    problems.raise_any(HINT)
    function = resolve(decode, key="data.args.decode") if decode else pair
    options: Mapping[str, Any] = {
        "decode": function,
        "decode_name": decode or "trainbox.streams.decode:pair",
        "window": shuffle_buffer,
        "lanes": lanes,
        "on_corrupt": on_corrupt,
    }
    streams = [
        None if path is None else ShardStream(read_manifest(path, key=key), **options)
        for key, path in (("data.args.train", train), ("data.args.val", val))
    ]
    return Datasets(train=streams[0], val=streams[1])
