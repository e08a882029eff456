"""Which lock and git revision the running image was built from (docs/image.md, Provenance)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

# docker/provenance.py writes it into the image's venv, which is sys.prefix there.
DIRECTORY = Path(sys.prefix) / "provenance"


@dataclass(frozen=True, kw_only=True, slots=True)
class Provenance:
    """What the image says about its own build; both None outside an image."""

    # sha256 of the hash-locked requirements the image installed.
    lock_sha256: str | None
    # The git revision the image was built from.
    revision: str | None


def read(directory: Path = DIRECTORY) -> Provenance:
    """The image's provenance.json, or Nones when there is none (a plain venv, a checkout)."""
    try:
        data = json.loads((directory / "provenance.json").read_text())
    except (OSError, ValueError):
        return Provenance(lock_sha256=None, revision=None)
    if not isinstance(data, dict):
        return Provenance(lock_sha256=None, revision=None)
    return Provenance(
        lock_sha256=_text(data.get("lock_sha256")), revision=_text(data.get("revision"))
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
