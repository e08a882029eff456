"""Pods of an elastic PyTorchJob (k8s/pytorchjob-elastic.yaml's shape: Workers only, with an
elasticPolicy), simulated as processes with exactly the operator's variables.

Each pod runs `trainbox run`, which reads the node range and rendezvous from PET_NNODES and
PET_RDZV_* and becomes its node's torchrun agent; torchrun's c10d rendezvous places the pods.
This lives with the other pod tests because the rendezvous host `<job>-worker-0` must resolve
as the cluster DNS would, through /etc/hosts, which the system group owns. How the job re-forms
when a node leaves or joins is proven with two torchrun agents in tests/dist/test_elastic.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from freeport import free_port
from launchers import pods
from runs import QUICK, clean_env, summary

pytestmark = pytest.mark.slow

JOB = "elastic"
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def elastic_pods(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, int], list[pods.Pod]]:
    """Two pods of a 1-to-2-node elastic job, run to the end: run_dir, exit codes, the pods."""
    pods.ensure_resolves(pods.elastic_pytorchjob_host(JOB))
    run_dir = tmp_path_factory.mktemp("elastic-pods") / "run"
    envs = pods.elastic_pytorchjob_pods(
        JOB, pods=2, nodes=(1, 2), nproc="1", port=free_port(), max_restarts=3
    )
    argv = [sys.executable, "-m", "trainbox", "run", f"run_dir={run_dir}", *QUICK]
    started = pods.start_pods(envs, argv, base_env=clean_env(), log_dir=run_dir.parent / "pods")
    codes = pods.wait_pods(started, timeout=TIMEOUT_S)
    return run_dir, codes, started


def test_both_pods_finish_and_train_as_one_job_of_two(
    elastic_pods: tuple[Path, dict[str, int], list[pods.Pod]],
) -> None:
    run_dir, codes, started = elastic_pods
    assert set(codes.values()) == {0}, f"pods exited {codes}\n{pods.logs(started)}"
    assert summary(run_dir)["world_size"] == 2, pods.logs(started)


def test_each_pod_hands_torchrun_the_operators_node_range_and_rendezvous(
    elastic_pods: tuple[Path, dict[str, int], list[pods.Pod]],
) -> None:
    _, _, started = elastic_pods
    agents = [
        json.loads(line)
        for pod in started
        for line in pod.log.read_text().splitlines()
        if line.startswith("{") and '"starting workers"' in line
    ]
    assert len(agents) == 2, pods.logs(started)
    for agent in agents:
        assert "--nnodes=1:2" in agent["argv"], agent
        assert "--rdzv-backend=c10d" in agent["argv"], agent
        assert f"--rdzv-endpoint={pods.elastic_pytorchjob_host(JOB)}:" in " ".join(agent["argv"]), (
            agent
        )
        assert "--max-restarts=3" in agent["argv"], agent
