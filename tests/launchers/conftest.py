"""Fixtures for the real-launcher tier (the Slurm cluster fixture lives in tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Job steps must run this venv's python; srun/sbatch pass the caller's PATH on to them.
VENV_BIN = Path(sys.executable).parent


# Variables of an outer launcher that would leak into the launchers these tests start.
_LAUNCHER_PREFIXES = (
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MV2_",
    "TORCHELASTIC_",
    "PET_",
    "TRAINBOX_",
)
_LAUNCHER_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
)


@pytest.fixture
def clean_env() -> dict[str, str]:
    """This process's environment without launcher variables, with the venv first on PATH."""
    import os

    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_LAUNCHER_PREFIXES) and key not in _LAUNCHER_NAMES
    }
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    return env
