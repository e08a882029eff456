"""Readers of a run kept in a store (`eval`, `predict`, `export`, `report`, `hang`,
`train.init_from`, `train.resume=URL`): the URL becomes a local path holding what they read.

    localise("s3://runs/exp1", env)                       -> its newest complete checkpoint,
                                                             in the run's working copy
    localise("s3://runs/exp1/checkpoints/step-00000040.pt", env)   -> that checkpoint, local
    localise("runs/exp1", env)                            -> "runs/exp1" (a path stays as it is)

Each call lists the run's prefix once and fetches into the node's working copy only what is
missing there; a checkpoint counts only when complete in the store (mirror.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainbox.errors import StorageError, UsageError
from trainbox.storage import location
from trainbox.storage.location import Location
from trainbox.storage.mirror import CHECKPOINTS, Mirror, complete_checkpoints, snapshot_of
from trainbox.storage.store import Entry, Store

LATEST = "latest"


def split_run(found: Location) -> tuple[Location, str]:
    """A URL's run root and the path inside the run it names ('', checkpoints[/NAME])."""
    parts = found.prefix.split("/") if found.prefix else []
    if CHECKPOINTS in parts:
        at = len(parts) - 1 - parts[::-1].index(CHECKPOINTS)
        if len(parts) - at <= 2:
            root = Location(bucket=found.bucket, prefix="/".join(parts[:at]))
            return root, "/".join(parts[at:])
    return found, ""


def localise(given: str, env: Mapping[str, str], *, what: str, checkpoint: bool = True) -> str:
    """`given` itself for a path; for an s3:// URL, the local path of what it names.

    `checkpoint`: also fetch the checkpoint it names (a run: its newest complete one).
    UsageError for a URL trainbox cannot read; StorageError for a store that fails.
    """
    if not location.is_url(given):
        return given
    if problems := location.problems(given, what=what):
        raise UsageError(problems, hint=location.URL_HINT)
    found = location.parse(given)
    assert found is not None  # a URL without problems parses
    root, inside = split_run(found)
    mirror = Mirror(root, location.working_copy(root, env), Store(root))
    listing = mirror.store.list()
    if not listing:
        raise StorageError(
            f"{what}={given!r}: nothing is stored under {root.url}",
            hint="name the s3:// URL a run was given as run_dir (aws s3 ls shows what is there)",
        )
    wanted = dict(snapshot_of(listing).run_files)
    if not checkpoint:
        mirror.fetch(wanted)
        return str(mirror.root / inside) if inside else str(mirror.root)
    # The checkpoint itself, not a run or `latest`: what it resolves to is decided here, by
    # the store's markers, so no local `latest` link is needed.
    name, files = _checkpoint(given, inside, listing, what=what)
    mirror.fetch({**wanted, **files})
    return str(mirror.root / name)


def _checkpoint(
    given: str, inside: str, listing: Mapping[str, Entry], *, what: str
) -> tuple[str, dict[str, Entry]]:
    """The complete checkpoint a URL names (a run or `latest`: the newest), and its objects."""
    complete = complete_checkpoints(listing)
    if inside in ("", CHECKPOINTS, f"{CHECKPOINTS}/{LATEST}"):
        if not complete:
            raise StorageError(
                f"{what}={given!r}: the run holds no complete checkpoint",
                hint="train it until a checkpoint is uploaded (train.ckpt_every), or name another",
            )
        name = next(reversed(complete))
        return name, complete[name]
    if inside not in complete:
        shown = ", ".join(Path(name).name for name in complete) or "none"
        raise StorageError(
            f"{what}={given!r} is not a complete checkpoint in the store (complete: {shown})",
            hint="name one of those, or the run's URL for its newest",
        )
    return inside, complete[inside]
