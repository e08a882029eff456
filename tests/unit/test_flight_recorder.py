"""The NCCL Flight Recorder's environment (pure): on by default on nccl, into run_dir/hang/,
never over a value the user set. No GPU here: what NCCL then does with it is not run."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox.distributed.flight_recorder import nccl_env

HANG = Path("/runs/a/hang")
ALL = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/runs/a/hang/nccl_trace_rank_",
}


@pytest.mark.parametrize(
    ("env", "backend", "entries", "expected"),
    [
        ({}, "nccl", 2000, ALL),
        ({}, "gloo", 2000, {}),
        ({}, "nccl", 0, {}),
        ({}, "nccl", 50, ALL | {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}),
        # The user's own values stand, under either of torch's names for the setting.
        ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, "nccl", 2000,
         {k: v for k, v in ALL.items() if k != "TORCH_NCCL_TRACE_BUFFER_SIZE"}),
        ({"TORCH_FR_BUFFER_SIZE": "10"}, "nccl", 2000,
         {k: v for k, v in ALL.items() if k != "TORCH_NCCL_TRACE_BUFFER_SIZE"}),
        ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, "nccl", 2000,
         {k: v for k, v in ALL.items() if k != "TORCH_NCCL_DUMP_ON_TIMEOUT"}),
        ({"TORCH_FR_DUMP_TEMP_FILE": "/x/fr_"}, "nccl", 2000,
         {k: v for k, v in ALL.items() if k != "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}),
        (ALL, "nccl", 2000, {}),
    ],
)  # fmt: skip
def test_the_flight_recorder_is_set_only_where_the_user_has_not(
    env: dict[str, str], backend: str, entries: int, expected: dict[str, str]
) -> None:
    assert nccl_env(env, backend=backend, evidence_dir=HANG, entries=entries) == expected
