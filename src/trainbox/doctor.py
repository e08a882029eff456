"""`trainbox doctor`: what this process was told, what it can use, and whether it looks healthy."""

from __future__ import annotations

import dataclasses
import socket

from trainbox import bootstrap, provenance
from trainbox.version import __version__


def findings(prepared: bootstrap.StartupFacts) -> dict[str, object]:
    """What doctor found, as one JSON-able object."""
    return {
        "trainbox": __version__,
        "host": socket.gethostname(),
        # Which lock and revision the image was built from (None outside an image).
        "image": dataclasses.asdict(provenance.read()),
        **prepared.context.describe(),
        **bootstrap.describe(prepared),
    }


def render(data: dict[str, object]) -> str:
    """The findings as aligned `key: value` lines for a person."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{key}:")
            lines.extend(f"  - {_inline(item)}" for item in value)
        elif isinstance(value, dict):
            lines.append(f"{key}: {_inline(value)}")
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _inline(item: dict[str, object]) -> str:
    return ", ".join(f"{key}={_short(value)}" for key, value in item.items())


def _short(value: object) -> str:
    if isinstance(value, list) and len(value) > 8:
        return f"[{len(value)} items: {value[0]}…{value[-1]}]"
    return str(value)
