"""srun steps: step-scoped variables, uneven nodes, master address and port; not the batch shell."""

from __future__ import annotations

import pytest

from trainbox.errors import LaunchError
from trainbox.launch import HostFacts, detect, ports, slurm

from launchcase import expect, srun_task, topology

# Task 3 of `srun -N2 --ntasks-per-node=2` in job 4242, step 0.
TASK = srun_task(
    procid=3,
    localid=1,
    nodeid=1,
    tasks=4,
    nodes=2,
    tasks_per_node="2(x2)",
    nodelist="gpu[07-08]",
    job="4242",
) | {"SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}
STEP_PORT = ports.derived_port("4242", "0")


def test_srun_task() -> None:
    assert topology(detect(TASK)) == expect("slurm", 3, 1, 4, 2, 1, 2, "gpu07", STEP_PORT)


def test_old_slurm_step_variable_name() -> None:
    env = {k: v for k, v in TASK.items() if k != "SLURM_STEP_ID"} | {"SLURM_STEPID": "0"}
    assert detect(env).launcher == "slurm"


@pytest.mark.parametrize(
    "batch_shell",
    [
        # sbatch's batch script is task 0 of the batch step: SLURM_PROCID=0 and no srun step id.
        {
            "SLURM_JOB_ID": "7",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_NTASKS": "4",
            "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_JOB_NODELIST": "n[1-2]",
        },
        # Some releases export the batch step's special id (0xfffffffb) instead.
        {
            "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": "4294967291",
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "4",
        },
        # The extern step (0xfffffffc), e.g. a process adopted by pam_slurm_adopt.
        {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "4294967292", "SLURM_PROCID": "0"},
    ],
    ids=["batch", "batch-step-id", "extern-step-id"],
)
def test_batch_shell_is_not_a_rank(batch_shell: dict[str, str]) -> None:
    context = detect(batch_shell)
    assert (context.launcher, context.world_size) == ("single", 1)
    assert "not in an srun step" in context.notes[0]


def test_step_values_win_over_job_values_under_preserve_env() -> None:
    # `srun --preserve-env -n2` inside a 4-task job keeps SLURM_NTASKS=4; the step has 2 tasks.
    env = TASK | {
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_STEP_NODELIST": "gpu08",
    }
    assert topology(detect(env)) == expect("slurm", 1, 1, 2, 2, 0, 1, "gpu08", STEP_PORT)


def test_uneven_tasks_per_node_take_this_nodes_entry() -> None:
    env = TASK | {
        "SLURM_PROCID": "8",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "2",
        "SLURM_STEP_NUM_TASKS": "11",
        "SLURM_STEP_NUM_NODES": "3",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2),3",
        "SLURM_STEP_NODELIST": "rack[1-3]",
    }
    context = detect(env)
    assert (context.local_world_size, context.world_size, context.master_addr) == (3, 11, "rack1")


def test_step_nodelist_is_used_not_the_job_nodelist() -> None:
    # A step on a subset of the allocation: the job's first node may not be in the step at all.
    env = TASK | {"SLURM_JOB_NODELIST": "gpu[01-08]", "SLURM_STEP_NODELIST": "gpu[07-08]"}
    assert detect(env).master_addr == "gpu07"


def test_user_master_wins() -> None:
    env = TASK | {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
    assert (detect(env).master_addr, detect(env).master_port) == ("10.0.0.1", 1234)


def test_reserved_ports_beat_derived_ones() -> None:
    assert detect(TASK | {"SLURM_STEP_RESV_PORTS": "12000-12003"}).master_port == 12000


def test_two_steps_of_one_job_get_different_ports() -> None:
    ports_by_step = {detect(TASK | {"SLURM_STEP_ID": str(step)}).master_port for step in range(8)}
    assert len(ports_by_step) == 8
    assert all(ports.DERIVED_PORT_BASE <= port < 30000 for port in ports_by_step)


def test_arbitrary_distribution_uses_the_hostfiles_first_line() -> None:
    env = TASK | {"SLURM_HOSTFILE": "/x/hosts", "SLURM_DISTRIBUTION": "arbitrary"}
    assert detect(env, HostFacts(slurm_hostfile_head="gpu08")).master_addr == "gpu08"


def test_unreadable_hostfile_is_an_error() -> None:
    env = TASK | {"SLURM_HOSTFILE": "/x/hosts", "SLURM_DISTRIBUTION": "arbitrary"}
    with pytest.raises(LaunchError, match="SLURM_HOSTFILE='/x/hosts' cannot be read"):
        detect(env, HostFacts())


def test_pmi2_variables_of_an_srun_step_are_slurm_not_mpi() -> None:
    # `srun --mpi=pmi2` sets PMI_RANK/PMI_SIZE in every task, equal to the step's values.
    env = TASK | {"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "5", "PMI_JOBID": "4242.0"}
    assert detect(env).launcher == "slurm"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"SLURM_STEP_NODELIST": "gpu[07-"},
            r"SLURM_STEP_NODELIST='gpu\[07-' is not a valid Slurm hostlist",
        ),
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 must be less than SLURM_STEP_NUM_TASKS=4"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "lists 3 nodes but SLURM_STEP_NUM_NODES=2"),
        ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "is not a Slurm task count list"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 must be less than"),
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x' is not an integer"),
        ({"SLURM_STEP_RESV_PORTS": "none"}, "SLURM_STEP_RESV_PORTS"),
    ],
)
def test_bad_step_variables_are_named(change: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        detect(TASK | change)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(LaunchError) as caught:
        detect(TASK | {"SLURM_PROCID": "9", "SLURM_STEP_NODELIST": "[", "SLURM_LOCALID": "-1"})
    assert len(caught.value.problems) == 3


# Once a variable is known bad, no check built on it runs: each row names only root causes.
ROOT_CAUSES = [
    (
        # The case: the node list check used to blame SLURM_STEP_TASKS_PER_NODE too.
        {"SLURM_NODEID": "3", "SLURM_STEP_TASKS_PER_NODE": "10(x2)", "SLURM_STEP_NUM_TASKS": "20"},
        ["SLURM_NODEID=3 must be less than SLURM_STEP_NUM_NODES=2"],
    ),
    # This node's entry (the SLURM_LOCALID limit) needs a good SLURM_NODEID.
    (
        {"SLURM_NODEID": "3", "SLURM_LOCALID": "5"},
        ["SLURM_NODEID=3 must be less than SLURM_STEP_NUM_NODES=2"],
    ),
    (
        {"SLURM_STEP_NUM_NODES": "0"},
        ["SLURM_STEP_NUM_NODES=0 must be at least 1"],
    ),
    (
        {"SLURM_STEP_TASKS_PER_NODE": "two", "SLURM_LOCALID": "5"},
        [
            "SLURM_STEP_TASKS_PER_NODE='two' is not a Slurm task count list ('two' is not N or N(xM))"
        ],
    ),
    # Independent problems are still all reported.
    (
        {"SLURM_PROCID": "9", "SLURM_NODEID": "3"},
        [
            "SLURM_PROCID=9 must be less than SLURM_STEP_NUM_TASKS=4",
            "SLURM_NODEID=3 must be less than SLURM_STEP_NUM_NODES=2",
        ],
    ),
]


@pytest.mark.parametrize(("change", "problems"), ROOT_CAUSES)
def test_checks_built_on_a_bad_variable_do_not_run(
    change: dict[str, str], problems: list[str]
) -> None:
    with pytest.raises(LaunchError) as caught:
        detect(TASK | change)
    assert caught.value.problems == problems


@pytest.mark.parametrize("raw", ["²", "٣", "1²"])
def test_a_step_id_of_non_ascii_digits_is_no_step(raw: str) -> None:
    # str.isdigit() accepts superscripts and other scripts' digits, which int() refuses.
    assert slurm.step_id({"SLURM_STEP_ID": raw}) is None


@pytest.mark.parametrize("raw", ["²", "²-12003", "٣٠٠٠"])
def test_a_reserved_port_list_of_non_ascii_digits_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="is not a Slurm port list"):
        ports.first_reserved_port(raw)
