"""`trainbox doctor`: what this process was told, what it can use, and whether it looks healthy."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence

from trainbox import __version__
from trainbox.launch.context import LaunchContext
from trainbox.preflight.nvml import GpuInfo

# Preflight checks and the pinning plan are reported as skipped until they are implemented.
NOT_YET = "not implemented in this version of trainbox"


def report(
    context: LaunchContext, *, gpus: Sequence[GpuInfo], cpus: Sequence[int]
) -> dict[str, object]:
    """The doctor report as one JSON-able object."""
    return {
        "trainbox": __version__,
        "host": socket.gethostname(),
        **context.describe(),
        "gpus": [dataclasses.asdict(gpu) for gpu in gpus],
        "checks": [{"name": "preflight", "status": "skip", "message": NOT_YET}],
        "pinning": {
            "cpus": sorted(cpus),
            "num_threads": None,
            "num_workers": None,
            "message": NOT_YET,
        },
    }


def render(data: dict[str, object]) -> str:
    """The report as aligned `key: value` lines for a person."""
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
