"""What `trainbox exec` execs: the command itself, or torchrun around it for a node agent."""

from __future__ import annotations

from trainbox import launch
from trainbox.launch import HostFacts, detect
from trainbox.process import exec_plan

from launchcase import srun_task

SRUN_TASK = srun_task(
    procid=1, localid=1, nodeid=0, tasks=2, nodes=1, tasks_per_node="2", nodelist="n1"
) | {"HOME": "/home/u"}
TRAINJOB_POD = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "4",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "tj-node-0-0.tj",
    "PET_MASTER_PORT": "29500",
    "HOME": "/home/u",
}


def test_a_rank_execs_the_command_with_torchrun_style_variables() -> None:
    target = exec_plan.plan(detect(SRUN_TASK), ["python", "train.py"], SRUN_TASK, python="py")
    assert target.argv == ("python", "train.py")
    assert target.env["HOME"] == "/home/u"
    assert {k: target.env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "n1",
    }


def test_a_node_agent_execs_torchrun_with_the_detected_place() -> None:
    context = detect(TRAINJOB_POD, HostFacts())
    target = exec_plan.plan(
        context, ["python", "train.py"], TRAINJOB_POD, python="/venv/bin/python"
    )
    assert target.argv == (
        "/venv/bin/python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=tj-node-0-0.tj",
        "--master-port=29500",
        "--nproc-per-node=4",
        "--max-restarts=0",
        "--no-python",
        "python",
        "train.py",
    )


ELASTIC_POD = {
    "PET_NNODES": "1:3",
    "PET_NPROC_PER_NODE": "2",
    "PET_RDZV_BACKEND": "c10d",
    "PET_RDZV_ENDPOINT": "el-worker-0:23456",
    "PET_RDZV_ID": "el",
    "PET_MAX_RESTARTS": "5",
}


def test_an_elastic_node_agent_hands_torchrun_the_node_range_and_rendezvous() -> None:
    context = detect(ELASTIC_POD, HostFacts())
    target = exec_plan.plan(context, ["trainbox", "run"], ELASTIC_POD, python="py")
    assert target.argv == (
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes=1:3",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=el-worker-0:23456",
        "--rdzv-id=el",
        "--nproc-per-node=2",
        "--max-restarts=5",
        "--no-python",
        "trainbox",
        "run",
    )


def test_an_elastic_agent_gives_each_round_its_own_store_unless_told_otherwise() -> None:
    target = exec_plan.plan(detect(ELASTIC_POD), ["x"], ELASTIC_POD, python="py")
    assert target.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    told = ELASTIC_POD | {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
    assert (
        exec_plan.plan(detect(told), ["x"], told, python="py").env[
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
        ]
        == "0"
    )
    fixed = exec_plan.plan(detect(TRAINJOB_POD), ["x"], TRAINJOB_POD, python="py")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in fixed.env


def test_without_a_policy_budget_dist_max_restarts_counts_for_an_elastic_job() -> None:
    env = {k: v for k, v in ELASTIC_POD.items() if k != "PET_MAX_RESTARTS"}
    target = exec_plan.plan(detect(env), ["x"], env, python="py", max_restarts=2)
    assert "--max-restarts=2" in target.argv


def test_the_agent_handles_sigusr1_and_leaves_ranks_to_torchrun() -> None:
    target = exec_plan.plan(detect(TRAINJOB_POD), ["x"], TRAINJOB_POD, python="py")
    assert "SIGUSR1" in target.env["TORCHELASTIC_SIGNALS_TO_HANDLE"].split(",")
    assert "RANK" not in target.env


SINGLE = {"HOME": "/home/u", "LOCAL_RANK": "2", "NODE_RANK": "1"}


def test_a_lone_process_gets_a_world_of_one_without_placement() -> None:
    context = launch.exported(detect(SINGLE, HostFacts()))
    target = exec_plan.plan(context, ["python", "train.py"], SINGLE, python="py")
    assert [name for name in exec_plan.PLACEMENT if name in target.env] == []
    assert (target.env["RANK"], target.env["WORLD_SIZE"], target.env["HOME"]) == (
        "0",
        "1",
        "/home/u",
    )


def test_the_log_line_names_the_world_and_where_it_came_from() -> None:
    context = detect(SRUN_TASK)
    target = exec_plan.plan(context, ["python"], SRUN_TASK, python="py")
    described = exec_plan.describe(target, context)
    assert (described["from"], described["world_size"]) == ("slurm (srun)", 2)
    assert described["variables"]["RANK"] == "1"
