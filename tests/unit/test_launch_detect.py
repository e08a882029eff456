"""Precedence, the TRAINBOX_LAUNCHER override, the single-process fallback and to_env()."""

from __future__ import annotations

import pytest

from trainbox.errors import LaunchError
from trainbox.launch import PRECEDENCE, detect

from launchcase import srun_task

SRUN_TASK = srun_task(
    procid=1, localid=1, nodeid=0, tasks=2, nodes=1, tasks_per_node="2", nodelist="n1"
)


def test_precedence_order_is_the_documented_one() -> None:
    assert [name for name, _ in PRECEDENCE] == ["torchrun", "mpi", "slurm", "kubeflow", "env"]


def test_nothing_set_is_a_single_process() -> None:
    context = detect({})
    assert (context.launcher, context.rank, context.world_size, context.notes) == (
        "single",
        0,
        1,
        (),
    )


def test_single_process_uses_port_zero_so_two_runs_never_collide() -> None:
    assert detect({}).master_port == 0


def test_srun_step_exporting_rank_by_hand_is_still_slurm() -> None:
    # Users often export RANK=$SLURM_PROCID in their scripts; the step's own variables decide.
    assert detect(SRUN_TASK | {"RANK": "1", "WORLD_SIZE": "2"}).launcher == "slurm"


@pytest.mark.parametrize(
    ("forced", "launcher"), [("slurm", "slurm"), ("single", "single"), (" env ", "env")]
)
def test_forced_launcher(forced: str, launcher: str) -> None:
    env = SRUN_TASK | {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "n1",
        "TRAINBOX_LAUNCHER": forced,
    }
    assert detect(env).launcher == launcher


def test_forcing_a_launcher_that_is_absent_says_what_it_needs() -> None:
    with pytest.raises(
        LaunchError, match="TRAINBOX_LAUNCHER=mpi but this process has no OMPI_COMM_WORLD_SIZE"
    ):
        detect({"TRAINBOX_LAUNCHER": "mpi"})


def test_unknown_forced_launcher() -> None:
    with pytest.raises(LaunchError, match="TRAINBOX_LAUNCHER='lsf' is not a launcher") as caught:
        detect({"TRAINBOX_LAUNCHER": "lsf"})
    assert "torchrun, mpi, slurm, kubeflow, env, single" in caught.value.hint


def test_to_env_is_torchrun_style() -> None:
    assert detect(SRUN_TASK | {"MASTER_PORT": "4000"}).to_env() == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "NODE_RANK": "0",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "4000",
    }


def test_error_line_names_every_problem_and_ends_with_a_hint() -> None:
    with pytest.raises(LaunchError) as caught:
        detect({"RANK": "x", "WORLD_SIZE": "-2"})
    line = caught.value.line()
    assert "\n" not in line
    assert line.startswith("RANK='x' is not an integer; WORLD_SIZE=-2 must be at least 1. HINT: ")


# Variables a launcher ignores are named in a launch note (doctor shows it, the CLI logs it).
IGNORED = [
    # Exported from the task's own values (RANK=$SLURM_PROCID): nothing stale, nothing to say.
    (SRUN_TASK | {"RANK": "1", "WORLD_SIZE": "2"}, []),
    (
        SRUN_TASK | {"RANK": "5", "WORLD_SIZE": "8"},
        [
            "ignoring RANK=5, WORLD_SIZE=8 from the environment: srun step 9.0 makes this"
            " task rank 1 of 2 (SLURM_PROCID, SLURM_STEP_NUM_TASKS)"
        ],
    ),
    (
        SRUN_TASK | {"WORLD_SIZE": "8"},
        [
            "ignoring WORLD_SIZE=8 from the environment: srun step 9.0 makes this task"
            " rank 1 of 2 (SLURM_PROCID, SLURM_STEP_NUM_TASKS)"
        ],
    ),
    ({}, []),
    (
        {"LOCAL_RANK": "1"},
        [
            "ignoring LOCAL_RANK=1: RANK and WORLD_SIZE are not set, so this is one process on"
            " its own (export RANK and WORLD_SIZE too, or start it under a launcher)"
        ],
    ),
    (
        {"LOCAL_RANK": "0", "NODE_RANK": "1"},
        [
            "ignoring LOCAL_RANK=0, NODE_RANK=1: RANK and WORLD_SIZE are not set, so this is one"
            " process on its own (export RANK and WORLD_SIZE too, or start it under a launcher)"
        ],
    ),
]


@pytest.mark.parametrize(
    ("env", "notes"),
    IGNORED,
    ids=["srun-own-values", "srun-stale", "srun-stale-world", "nothing", "local-rank", "node-rank"],
)
def test_ignored_launch_variables_are_noted(env: dict[str, str], notes: list[str]) -> None:
    assert list(detect(env).notes) == notes
