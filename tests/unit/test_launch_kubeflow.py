"""Kubeflow pods, with the environment exactly as the operators inject it.

PyTorchJob (training-operator v1.7-v1.9): kubeflow/training-operator release-1.9,
pkg/controller.v1/pytorch/envvar.go `setPodEnv` (PYTHONUNBUFFERED, WORLD_SIZE = Σ replicas *
nprocPerNode with non-integers counted as 1, RANK = pod index with workers at index + 1,
PET_NODE_RANK, PET_NPROC_PER_NODE, PET_NNODES) and master.go `MasterEnvVarGenerator.Generate`
(MASTER_ADDR = `<job>-master-0`, MASTER_PORT = the `pytorchjob-port` container port, default
23456, and the PET_MASTER_ADDR/PET_MASTER_PORT twins).
TrainJob (Trainer v2, release-2.3): kubeflow/trainer pkg/runtime/framework/plugins/torch/torch.go
`EnforceMLPolicy` (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK from the job-completion-index
annotation, PET_MASTER_ADDR = `<trainjob>-node-0-0.<trainjob>`, PET_MASTER_PORT = 29500);
Kubernetes adds JOB_COMPLETION_INDEX to Indexed-Job pods.
PyTorchJob with elasticPolicy (release-1.9, pkg/controller.v1/pytorch/elastic.go
`ElasticEnvVarGenerator.Generate`): PET_NNODES = "minReplicas:maxReplicas", PET_RDZV_BACKEND
(default c10d), PET_RDZV_ENDPOINT = `<rdzvHost or job-worker-0>:<rdzvPort or pytorchjob-port>`,
PET_MAX_RESTARTS, PET_RDZV_ID and PET_RDZV_CONF when set; a Worker-only job gets no MASTER_*,
RANK, WORLD_SIZE or PET_NODE_RANK.
"""

from __future__ import annotations

import pytest

from trainbox.errors import LaunchError
from trainbox.launch import HostFacts, detect

from launchcase import expect, topology


def pytorchjob_pod(*, replica: str, index: int, pods: int, nproc: str) -> dict[str, str]:
    """The env of container `pytorch` in one pod of PyTorchJob `mnist` (Master + Workers)."""
    rank = index if replica == "master" else index + 1
    per_pod = int(nproc) if nproc.isdigit() else 1
    return {
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": "mnist-master-0",
        "MASTER_PORT": "23456",
        "PET_MASTER_ADDR": "mnist-master-0",
        "PET_MASTER_PORT": "23456",
        "WORLD_SIZE": str(pods * per_pod),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NNODES": str(pods),
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    }


def trainjob_pod(*, index: int, nodes: int, nproc: str) -> dict[str, str]:
    """The env of container `node` in one pod of TrainJob `tj`."""
    return {
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NODE_RANK": str(index),
        "PET_MASTER_ADDR": "tj-node-0-0.tj",
        "PET_MASTER_PORT": "29500",
        "JOB_COMPLETION_INDEX": str(index),
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    }


def elastic_pod(**extra: str) -> dict[str, str]:
    """The env of a Worker pod of the Worker-only PyTorchJob `el` with an elasticPolicy."""
    return {
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_NNODES": "1:4",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": "el-worker-0:23456",
        "PET_MAX_RESTARTS": "3",
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        **extra,
    }


def test_an_elastic_pod_is_its_nodes_agent_for_the_whole_node_range() -> None:
    context = detect(elastic_pod(PET_RDZV_ID="el", PET_RDZV_CONF="join_timeout=900"))
    assert (context.launcher, context.spawns_workers, context.local_world_size) == (
        "kubeflow",
        True,
        2,
    )
    assert context.elastic is not None
    assert (context.elastic.min_nodes, context.elastic.max_nodes) == (1, 4)
    assert (context.elastic.endpoint, context.elastic.backend) == ("el-worker-0:23456", "c10d")
    assert (context.elastic.run_id, context.elastic.conf) == ("el", "join_timeout=900")
    assert context.elastic.max_restarts == 3
    # The largest world it may reach; torchrun's rendezvous says the real one.
    assert (context.num_nodes, context.world_size) == (4, 8)
    assert (context.master_addr, context.master_port) == ("el-worker-0", 23456)
    assert any("elastic PyTorchJob: 1 to 4 nodes" in note for note in context.notes)


def test_even_one_process_per_elastic_pod_goes_through_torchrun() -> None:
    # Only torchrun's rendezvous can place a pod whose rank the operator does not give.
    context = detect(elastic_pod(PET_NPROC_PER_NODE="1"))
    assert context.spawns_workers
    assert context.elastic is not None


def test_an_elastic_range_of_one_size_and_no_policy_restarts() -> None:
    env = elastic_pod(PET_NNODES="2")
    del env["PET_MAX_RESTARTS"]
    elastic = detect(env).elastic
    assert elastic is not None
    assert (elastic.min_nodes, elastic.max_nodes, elastic.max_restarts) == (2, 2, None)


@pytest.mark.parametrize(
    ("env", "gpus", "expected"),
    [
        # nprocPerNode left at its default `auto` on a CPU pod: one process per pod.
        (
            pytorchjob_pod(replica="worker", index=0, pods=3, nproc="auto"),
            0,
            expect("kubeflow", 1, 0, 3, 1, 1, 3, "mnist-master-0", 23456),
        ),
        (
            pytorchjob_pod(replica="master", index=0, pods=3, nproc="1"),
            0,
            expect("kubeflow", 0, 0, 3, 1, 0, 3, "mnist-master-0", 23456),
        ),
        # nprocPerNode: 4: this pod is a node that starts 4 workers (RANK is the pod index).
        (
            pytorchjob_pod(replica="worker", index=0, pods=2, nproc="4"),
            0,
            expect("kubeflow", 4, 0, 8, 4, 1, 2, "mnist-master-0", 23456, spawns_workers=True),
        ),
        # `auto` on a 2-GPU pod: one worker per GPU, as torchrun would do.
        (
            pytorchjob_pod(replica="master", index=0, pods=2, nproc="auto"),
            2,
            expect("kubeflow", 0, 0, 4, 2, 0, 2, "mnist-master-0", 23456, spawns_workers=True),
        ),
        (
            trainjob_pod(index=1, nodes=2, nproc="1"),
            0,
            expect("kubeflow", 1, 0, 2, 1, 1, 2, "tj-node-0-0.tj", 29500),
        ),
        # On a CPU node the operator turns `auto` into the CPU count of resourcesPerNode.
        (
            trainjob_pod(index=1, nodes=2, nproc="2"),
            0,
            expect("kubeflow", 2, 0, 4, 2, 1, 2, "tj-node-0-0.tj", 29500, spawns_workers=True),
        ),
        (
            trainjob_pod(index=0, nodes=3, nproc="auto"),
            8,
            expect("kubeflow", 0, 0, 24, 8, 0, 3, "tj-node-0-0.tj", 29500, spawns_workers=True),
        ),
    ],
    ids=[
        "pytorchjob-auto-cpu",
        "pytorchjob-nproc-1",
        "pytorchjob-nproc-4",
        "pytorchjob-auto-2gpu",
        "trainjob-1",
        "trainjob-cpu-2",
        "trainjob-auto-8gpu",
    ],
)
def test_kubeflow_pods(env: dict[str, str], gpus: int, expected: dict[str, object]) -> None:
    assert topology(detect(env, HostFacts(visible_gpus=gpus))) == expected


def test_flavors() -> None:
    assert (
        detect(pytorchjob_pod(replica="master", index=0, pods=1, nproc="1")).flavor == "pytorchjob"
    )
    assert detect(trainjob_pod(index=0, nodes=1, nproc="1")).flavor == "trainjob"


def test_kubernetes_variables_alone_are_not_kubeflow() -> None:
    # Every pod has KUBERNETES_PORT; Lightning's old heuristic misfired on it.
    assert detect({"KUBERNETES_PORT": "tcp://10.96.0.1:443"}).launcher == "single"


def test_symbolic_nproc_is_noted() -> None:
    notes = detect(trainjob_pod(index=0, nodes=1, nproc="auto"), HostFacts(visible_gpus=2)).notes
    assert notes == ("PET_NPROC_PER_NODE='auto' resolved to 2 process(es) per pod",)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # Worker-only PyTorchJob: no Master spec, so the operator sets no master address or rank.
        (
            {
                "PYTHONUNBUFFERED": "1",
                "PET_NPROC_PER_NODE": "auto",
                "PET_NNODES": "2",
                "PET_NODE_RANK": "0",
            },
            "neither MASTER_ADDR nor PET_MASTER_ADDR is set",
        ),
        (
            trainjob_pod(index=0, nodes=2, nproc="1") | {"PET_MASTER_ADDR": ""},
            "neither MASTER_ADDR nor PET_MASTER_ADDR is set",
        ),
        (
            trainjob_pod(index=2, nodes=2, nproc="1"),
            "PET_NODE_RANK=2 must be less than PET_NNODES=2",
        ),
        (
            trainjob_pod(index=0, nodes=2, nproc="many"),
            "PET_NPROC_PER_NODE='many' is not an integer",
        ),
        (
            pytorchjob_pod(replica="worker", index=0, pods=2, nproc="4") | {"WORLD_SIZE": "2"},
            r"WORLD_SIZE=2 is not PET_NNODES=2 \* nprocPerNode=4",
        ),
        (
            pytorchjob_pod(replica="worker", index=0, pods=2, nproc="1") | {"RANK": "0"},
            "RANK=0 differs from PET_NODE_RANK=1",
        ),
        (elastic_pod() | {"PET_NNODES": "4:1"}, r"PET_NNODES='4:1' is not MIN:MAX nodes"),
        (elastic_pod() | {"PET_NNODES": "one:4"}, r"PET_NNODES='one:4' is not MIN:MAX nodes"),
        (
            elastic_pod() | {"PET_RDZV_ENDPOINT": "job-worker-0"},
            "PET_RDZV_ENDPOINT='job-worker-0' is not host:port",
        ),
        (
            elastic_pod() | {"PET_RDZV_BACKEND": "zookeeper"},
            "PET_RDZV_BACKEND='zookeeper' is not one of c10d, etcd, etcd-v2",
        ),
        (elastic_pod() | {"PET_MAX_RESTARTS": "-1"}, "PET_MAX_RESTARTS=-1 must be at least 0"),
    ],
    ids=[
        "worker-only",
        "trainjob-no-master",
        "node-rank",
        "bad-nproc",
        "world-size",
        "rank",
        "elastic-range-reversed",
        "elastic-range-word",
        "elastic-endpoint",
        "elastic-backend",
        "elastic-restarts",
    ],
)
def test_bad_kubeflow_pods(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        detect(env)
