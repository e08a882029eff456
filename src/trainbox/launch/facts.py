"""HostFacts: the few things detection needs from outside the environment mapping."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True, slots=True)
class HostFacts:
    """Facts about this host that turn `auto` and `arbitrary` launcher settings into numbers."""

    # GPUs this process may use (after CUDA_VISIBLE_DEVICES); resolves `nprocPerNode: auto`.
    visible_gpus: int = 0
    # First host in $SLURM_HOSTFILE: rank 0 runs there under `srun --distribution=arbitrary`.
    slurm_hostfile_head: str | None = None


def gather(env: Mapping[str, str], *, visible_gpus: int) -> HostFacts:
    """Read the host facts for this process (the side-effecting half of detection).

    The GPU count comes from the caller's one NVML survey, so NVML starts once per process.
    """
    return HostFacts(
        visible_gpus=visible_gpus, slurm_hostfile_head=_first_line(env.get("SLURM_HOSTFILE"))
    )


def _first_line(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with Path(path).open() as handle:
            for line in handle:
                if line.strip():
                    return line.strip()
    except OSError:
        return None
    return None
