"""Write this process's launcher-related environment to DIR/<pid>.json (run by real launchers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Only what launchers and operators set; the rest of the environment is the machine's business.
PREFIXES = (
    "SLURM_",
    "SLURMD_",
    "OMPI_COMM_WORLD_",
    "OMPI_MCA_ess",
    "OMPI_UNIVERSE",
    "PMIX_RANK",
    "PMIX_NAMESPACE",
    "PMI_",
    "MPI_LOCAL",
    "MV2_",
    "MVP_",
    "PALS_",
    "TORCHELASTIC_",
    "PET_",
    "KUBEFLOW_",
)
NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "JOB_COMPLETION_INDEX",
)


def relevant(env: dict[str, str]) -> dict[str, str]:
    """The launcher variables of `env`, sorted by name."""
    return {k: v for k, v in sorted(env.items()) if k in NAMES or k.startswith(PREFIXES)}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{os.getpid()}.json").write_text(json.dumps(relevant(dict(os.environ)), indent=1))
