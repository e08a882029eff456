"""Kubeflow pods simulated as local processes, each with the environment its operator injects.

There is no Kubernetes here, so a pod is a process started with exactly the variables the
operator puts into the training container (the same facts as tests/unit/test_launch_kubeflow.py):

- PyTorchJob (training-operator v1.7-v1.9): kubeflow/training-operator release-1.9,
  pkg/controller.v1/pytorch/envvar.go `setPodEnv` (PYTHONUNBUFFERED, WORLD_SIZE = pods *
  nprocPerNode with non-integers counted as 1, RANK = pod index with workers at index + 1,
  PET_NODE_RANK, PET_NPROC_PER_NODE, PET_NNODES) and master.go `MasterEnvVarGenerator.Generate`
  (MASTER_ADDR = `<job>-master-0`, MASTER_PORT, and the PET_MASTER_ADDR/PET_MASTER_PORT twins).
- PyTorchJob with an elasticPolicy and Workers only (release-1.9, elastic.go
  `ElasticEnvVarGenerator.Generate`): PYTHONUNBUFFERED, PET_NPROC_PER_NODE, PET_NNODES = "MIN:MAX",
  PET_RDZV_BACKEND, PET_RDZV_ENDPOINT = `<job>-worker-0:<port>`, PET_MAX_RESTARTS; no MASTER_*,
  RANK, WORLD_SIZE or PET_NODE_RANK (envvar.go sets those only when a Master exists).
- TrainJob (Trainer v2, release-2.3): kubeflow/trainer pkg/runtime/framework/plugins/torch/
  torch.go `EnforceMLPolicy` (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR =
  `<trainjob>-node-0-0.<trainjob>`, PET_MASTER_PORT); Kubernetes adds JOB_COMPLETION_INDEX to
  Indexed-Job pods, and the kubelet adds HOSTNAME and the KUBERNETES_* service variables.

The master's name must resolve as it does through the cluster DNS: `ensure_resolves` maps it to
127.0.0.1 in /etc/hosts, where every simulated pod lives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import hosts
import tiers

# What the kubelet adds to every container for the API server's Service (values from kind).
_KUBELET_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
}


def pytorchjob_master(job: str) -> str:
    """The master address the training operator gives every pod of PyTorchJob `job`."""
    return f"{job}-master-0"


def trainjob_master(name: str) -> str:
    """The master address the Trainer's torch plugin gives every pod of TrainJob `name`."""
    return f"{name}-node-0-0.{name}"


def pytorchjob_env(
    job: str, replica: str, index: int, *, pods: int, nproc: str, port: int
) -> dict[str, str]:
    """The operator-injected env of one pod (`replica` is master or worker) of PyTorchJob `job`.

    Real operators use the `pytorchjob-port` container port (default 23456); tests pass a fresh
    free port instead, so that no two runs, nor anything else on the box, collide on it.
    """
    rank = index if replica == "master" else index + 1
    per_pod = int(nproc) if nproc.isdigit() else 1
    master = pytorchjob_master(job)
    return {
        **_KUBELET_ENV,
        "HOSTNAME": f"{job}-{replica}-{index}",
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": str(port),
        "WORLD_SIZE": str(pods * per_pod),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NNODES": str(pods),
    }


def pytorchjob_pods(job: str, *, pods: int, nproc: str, port: int) -> list[dict[str, str]]:
    """Every pod of a PyTorchJob with one Master and `pods - 1` Workers, master first."""
    master = pytorchjob_env(job, "master", 0, pods=pods, nproc=nproc, port=port)
    workers = [
        pytorchjob_env(job, "worker", index, pods=pods, nproc=nproc, port=port)
        for index in range(pods - 1)
    ]
    return [master, *workers]


def elastic_pytorchjob_host(job: str) -> str:
    """Where the training operator points an elastic PyTorchJob's rendezvous: its worker 0."""
    return f"{job}-worker-0"


def elastic_pytorchjob_pods(
    job: str, *, pods: int, nodes: tuple[int, int], nproc: str, port: int, max_restarts: int
) -> list[dict[str, str]]:
    """Every Worker pod of the Worker-only PyTorchJob `job` with elasticPolicy minReplicas,
    maxReplicas = `nodes` and maxRestarts; `port` stands for the pytorchjob-port (23456)."""
    return [
        {
            **_KUBELET_ENV,
            "HOSTNAME": f"{job}-worker-{index}",
            "PYTHONUNBUFFERED": "1",
            "PET_NPROC_PER_NODE": nproc,
            "PET_NNODES": f"{nodes[0]}:{nodes[1]}",
            "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": f"{elastic_pytorchjob_host(job)}:{port}",
            "PET_MAX_RESTARTS": str(max_restarts),
        }
        for index in range(pods)
    ]


def trainjob_env(name: str, index: int, *, nodes: int, nproc: str, port: int) -> dict[str, str]:
    """The env the Trainer injects into pod `index` of TrainJob `name`.

    The torch plugin's PET_MASTER_PORT is 29500; tests pass a fresh free port instead.
    """
    return {
        **_KUBELET_ENV,
        "HOSTNAME": f"{name}-node-0-{index}",
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NODE_RANK": str(index),
        "PET_MASTER_ADDR": trainjob_master(name),
        "PET_MASTER_PORT": str(port),
        "JOB_COMPLETION_INDEX": str(index),
    }


def trainjob_pods(name: str, *, nodes: int, nproc: str, port: int) -> list[dict[str, str]]:
    """Every pod of TrainJob `name`, in node order."""
    return [
        trainjob_env(name, index, nodes=nodes, nproc=nproc, port=port) for index in range(nodes)
    ]


def ensure_resolves(*names: str) -> None:
    """Make each pod host name resolve to 127.0.0.1, as the cluster DNS would resolve it.

    Appends to /etc/hosts (in place: it is often a bind mount) only for names that do not
    resolve yet, so repeated calls add nothing; that needs root, else the test is unavailable.
    """
    missing = hosts.unresolved(names)
    if not missing:
        return
    if os.geteuid() != 0:
        tiers.unavailable(f"pod host names {missing} do not resolve, and only root may add them")
    hosts.add_loopback(missing, why="trainbox test kubeflow pods")


@dataclass(frozen=True)
class Pod:
    """One simulated pod: its process and the file holding its stdout and stderr."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_pods(
    envs: Sequence[Mapping[str, str]],
    argv: Sequence[str],
    *,
    base_env: Mapping[str, str],
    log_dir: Path,
) -> list[Pod]:
    """Start one process per pod env, running the container's command `argv`.

    `base_env` stands for what the image itself sets (PATH and the like); the operator's
    variables go on top. Output goes to files, so no pod blocks on a full pipe while we wait.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    pods = []
    for env in envs:
        name = env["HOSTNAME"]
        log = log_dir / f"{name}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                list(argv),
                env={**base_env, **env},
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                # Own session, like a pod's own PID namespace: a timeout can stop the pod's
                # agent and its workers together.
                start_new_session=True,
            )
        pods.append(Pod(name=name, proc=proc, log=log))
    return pods


def wait_pods(pods: Sequence[Pod], *, timeout: float = 180) -> dict[str, int]:
    """Wait for every pod to exit; returns {pod name: exit code}.

    A pod still running after `timeout` seconds (all pods share that deadline, as they form one
    job) is killed with its whole session, and reported as -SIGKILL.
    """
    deadline = time.monotonic() + timeout
    with _stopping_leftovers(pods):
        for pod in pods:
            pod.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    return {pod.name: pod.proc.returncode for pod in pods}


def logs(pods: Sequence[Pod]) -> str:
    """Every pod's output under a header naming it, for assertion messages."""
    return "\n".join(
        f"--- pod {pod.name} (rc={pod.proc.returncode}) ---\n"
        + pod.log.read_text(encoding="utf-8", errors="replace")[-6000:]
        for pod in pods
    )


@contextlib.contextmanager
def _stopping_leftovers(pods: Sequence[Pod]) -> Iterator[None]:
    # A timed-out wait must not leave a pod's agent or workers behind to hold ports and CPUs.
    try:
        yield
    except subprocess.TimeoutExpired:
        pass
    finally:
        for pod in pods:
            if pod.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
