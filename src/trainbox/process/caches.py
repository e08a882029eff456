"""The one cache a run writes outside run_dir, and where: under the user's HOME, never /tmp.

torch makes its compile cache (TorchInductor's, with Triton's kernels inside it) as soon as
torch._dynamo is imported, which DDP does even without `train.compile`. Its default,
/tmp/torchinductor_<user>, is outside both run_dir and HOME; under Apptainer /tmp is the node's
own, shared by every job on it and not cleaned up after any of them. trainbox points it at the
user's cache directory instead, where the next run reuses compiled kernels, and logs where.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


@dataclass(frozen=True, kw_only=True, slots=True)
class Cache:
    """Where a cache is, what chose that place, and the variables that put it there."""

    # The cache directory.
    path: str
    # What chose it: the variable the user set, HOME, or why torch's default stays.
    source: str
    # Variables a process needs to use it ({} when nothing has to be set).
    env: dict[str, str] = field(default_factory=dict)


def compile_cache(env: Mapping[str, str]) -> Cache:
    """torch's compile cache for a process started with `env`; creates the directory."""
    given = env.get(VARIABLE)
    if given:
        return Cache(path=given, source=VARIABLE)
    home = env.get("HOME") or os.path.expanduser("~")
    base = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    path = os.path.join(base, "trainbox", "torchinductor")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        # Failing the run over a cache would be worse than torch's default: say where it went.
        temp = env.get("TMPDIR") or "/tmp"
        return Cache(
            path=os.path.join(temp, "torchinductor_<user>"),
            source=f"torch's default: {path} is not writable ({err.strerror})",
        )
    return Cache(path=path, source="HOME", env={VARIABLE: path})
