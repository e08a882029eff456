"""FILE.parts/: one durable file per finished chunk, and a manifest of what they came from."""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainbox import atomic
from trainbox.infer.chunks import Chunk, differences
from trainbox.logs import log

MANIFEST = "manifest.json"


def directory_for(output: Path) -> Path:
    """Where the parts of `output` are kept until the merge."""
    return output.with_name(output.name + ".parts")


def part_path(directory: Path, number: int, fmt: str) -> Path:
    """The part file of chunk `number`."""
    return directory / f"part-{number:08d}.{fmt}"


def reusable(
    directory: Path, manifest: Mapping[str, Any], chunks: Sequence[Chunk], fmt: str
) -> list[int]:
    """Numbers of the chunks whose parts a rerun may keep; parts of other work are removed."""
    # Compared as JSON reads back (tuples become lists), or a rerun would never match.
    wanted = json.loads(json.dumps(dict(manifest), default=str))
    found = _read_manifest(directory)
    if found != wanted:
        if directory.exists():
            log.warning(
                "discarding prediction parts made from other input",
                parts=str(directory),
                differing=differences(found, wanted) if found else ["manifest"],
            )
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        text = json.dumps(wanted, indent=2, sort_keys=True) + "\n"
        atomic.write(directory / MANIFEST, [text.encode()])
        return []
    for leftover in directory.glob(".*.tmp"):
        leftover.unlink(missing_ok=True)
    done = []
    for chunk in chunks:
        path = part_path(directory, chunk.number, fmt)
        if not path.is_file():
            continue
        # Renamed into place whole, so a short part is not a torso but a foreign file.
        if path.read_bytes().count(b"\n") == chunk.rows:
            done.append(chunk.number)
        else:
            log.warning("recomputing a part with the wrong number of rows", part=str(path))
            path.unlink()
    return done


def write_part(directory: Path, number: int, fmt: str, data: bytes) -> None:
    """Make one chunk's rows durable under their final name."""
    atomic.write(part_path(directory, number, fmt), [data])


def merge(
    output: Path,
    directory: Path,
    chunks: Sequence[Chunk],
    fmt: str,
    *,
    header: bytes,
    after_piece: Callable[[int], None] | None = None,
) -> None:
    """Header and parts in chunk order into `output` (atomically), then drop the parts."""
    for leftover in atomic.leftovers(output):
        leftover.unlink(missing_ok=True)  # the torso of a killed merge
    pieces = itertools.chain(
        [header], (part_path(directory, c.number, fmt).read_bytes() for c in chunks)
    )
    atomic.write(output, pieces, after_piece=after_piece)
    shutil.rmtree(directory)


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        found = json.loads((directory / MANIFEST).read_text())
        return found if isinstance(found, dict) else None
    return None
