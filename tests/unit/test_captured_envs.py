"""Detection on environments captured from the real launchers (tests/launchers/capture.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainbox.launch import detect

from launchcase import place

ENVS = Path(__file__).parent / "envs"

# Per case, one row per process in rank order, from what the command asks for:
# (launcher, rank, local_rank, world_size, local_world_size, node_rank, num_nodes, master_addr).
EXPECTED: dict[str, list[tuple[object, ...]]] = {
    "torchrun_nproc2": [("torchrun", r, r, 2, 2, 0, 1, "localhost") for r in range(2)],
    "mpirun_np2": [("mpi", r, r, 2, 2, 0, 1, "127.0.0.1") for r in range(2)],
    "srun_N2_tpn2": [("slurm", r, r % 2, 4, 2, r // 2, 2, "n1") for r in range(4)],
    "srun_N2_tpn1": [("slurm", r, 0, 2, 1, r, 2, "n1") for r in range(2)],
    # --mpi=pmi2 adds PMI_RANK/PMI_SIZE to every task: still an srun step, not mpirun.
    "srun_pmi2": [("slurm", r, r, 2, 2, 0, 1, "n1") for r in range(2)],
    # The batch shell carries SLURM_PROCID=0 and SLURM_NTASKS=4 but is not a rank.
    "sbatch_shell": [("single", 0, 0, 1, 1, 0, 1, "127.0.0.1")],
    # Ranks also see the srun step Open MPI used for its daemons (SLURM_PROCID = node index).
    "mpirun_in_sbatch": [("mpi", r, r % 2, 4, 2, r // 2, 2, "n1") for r in range(4)],
    # Workers also see the srun step that started the torchrun agents.
    "torchrun_in_srun": [("torchrun", r, r % 2, 4, 2, r // 2, 2, "n1") for r in range(4)],
    # LOCAL_RANK=0 in every worker; the place on the node comes from RANK and GROUP_RANK.
    "torchrun_virtual_local_rank": [
        ("torchrun", r, r % 2, 4, 2, r // 2, 2, "n1") for r in range(4)
    ],
}


def _processes(case: str) -> list[dict[str, str]]:
    return json.loads((ENVS / f"{case}.json").read_text())["processes"]


def test_every_captured_case_has_expectations() -> None:
    assert sorted(path.stem for path in ENVS.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_captured_environment(case: str) -> None:
    processes = _processes(case)
    assert len(processes) == len(EXPECTED[case])
    for env, row in zip(processes, EXPECTED[case], strict=True):
        assert place(detect(env).describe()) == row


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_all_ranks_of_a_case_agree_on_the_master(case: str) -> None:
    masters = {(c.master_addr, c.master_port) for c in map(detect, _processes(case))}
    assert len(masters) == 1
