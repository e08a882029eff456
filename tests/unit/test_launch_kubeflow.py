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
        # elasticPolicy: PET_NNODES is `min:max` and a rendezvous endpoint replaces the master.
        (
            {
                "PET_RDZV_ENDPOINT": "job-worker-0:23456",
                "PET_RDZV_BACKEND": "c10d",
                "PET_NNODES": "1:4",
                "PET_NPROC_PER_NODE": "auto",
            },
            "elastic PyTorchJob",
        ),
    ],
    ids=[
        "worker-only",
        "trainjob-no-master",
        "node-rank",
        "bad-nproc",
        "world-size",
        "rank",
        "elastic",
    ],
)
def test_bad_kubeflow_pods(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        detect(env)
