"""Pure: the environment that turns on PyTorch's NCCL Flight Recorder for a run.

The Flight Recorder keeps each rank's last collectives in a ring buffer (ProcessGroupNCCL) and,
with dump-on-timeout, writes them to a file per rank when NCCL's watchdog sees a collective
time out: which collective, its sequence number and sizes, and where it was called. trainbox
points the files into run_dir/hang/, beside the Python stacks its own watchdog writes. A
variable the user set, under either of torch's names, is left as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

# The variable trainbox sets, and every name torch 2.13 also reads for the same setting
# (torch/csrc/distributed/c10d/FlightRecorder.hpp and ProcessGroupNCCL.hpp): set under any of
# them, the user's value stands.
BUFFER = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
DUMP_ON_TIMEOUT = ("TORCH_NCCL_DUMP_ON_TIMEOUT",)
# A prefix: torch appends the rank to it.
DUMP_FILE = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
FILE_PREFIX = "nccl_trace_rank_"


def nccl_env(
    env: Mapping[str, str], *, backend: str, evidence_dir: Path, entries: int
) -> dict[str, str]:
    """The variables to add to `env` (none the user set): only on nccl, with entries > 0."""
    if backend != "nccl" or entries <= 0:
        return {}
    wanted = {
        BUFFER: str(entries),
        DUMP_ON_TIMEOUT: "1",
        DUMP_FILE: str(evidence_dir / FILE_PREFIX),
    }
    return {
        names[0]: value for names, value in wanted.items() if not any(name in env for name in names)
    }
