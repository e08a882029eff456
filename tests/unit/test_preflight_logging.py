"""Which preflight warnings each rank logs: a node's own findings once per node, a rank's own
GPUs' findings on every rank."""

from __future__ import annotations

import pytest

from trainbox.preflight import worth_logging

CASES = [
    # (check, local rank, logged)
    ("driver", 0, True),
    ("driver", 1, False),
    ("cuda_version", 3, False),
    ("shm", 1, False),
    ("disk_space", 1, False),
    ("master_address", 1, False),
    ("run_dir", 1, False),
    ("fabric", 2, False),
    ("storage", 1, False),
    # Under srun --gpus-per-task each rank sees other GPUs: their findings are its own.
    ("temperature", 1, True),
    ("gpu_count", 1, True),
    ("ecc", 2, True),
    ("gpu_visibility", 1, True),
    ("persistence", 3, True),
]


@pytest.mark.parametrize(("name", "local_rank", "logged"), CASES)
def test_node_findings_are_logged_by_local_rank_0_only(
    name: str, local_rank: int, logged: bool
) -> None:
    assert worth_logging(name, local_rank=local_rank) is logged
