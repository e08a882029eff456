"""k8s/pytorchjob.yaml and k8s/trainjob.yaml, rendered into the pods their operators create and
run with `podman kube play` from the image built here. tests/container/kube.py says what is
rendered and what podman 4.3 cannot honour; there is no Kubernetes API server here.

Only the knobs a user edits change (`knobs`): 2 pods of 1 CPU and 4 GiB each, no GPU limit, a
1 GiB /dev/shm, and `preflight.gpus=auto` after the manifest's `require` so that the pods train
on CPU. The PyTorchJob runs one process per pod (trainbox is the rank); the TrainJob runs two
(trainbox supervises torchrun in the pod, as with the shipped 8 GPUs per pod).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from container import kube
from container.image import podman

pytestmark = pytest.mark.slow

NODES = 2
# Processes per pod of each job.
NPROC = {"pytorchjob": 1, "trainjob": 2}
QUICK = (
    "preflight.gpus=auto",  # no GPU here; the manifests say `require`
    "train.max_steps=40",
    "train.ckpt_every=10",
    "train.eval_every=20",
    "dist.timeout_s=120",
)
# The same run with every parameter sharded over the pods (train.strategy=fsdp).
FSDP = (*QUICK, "train.strategy=fsdp")
# Rank 1, the Worker pod, waits before step 25, after the checkpoint of step 20.
STALL = "stall:rank=1:step=25"
Render = Callable[[kube.Knobs], list[dict[str, Any]]]


def knobs(image: str, kind: str, **changes: Any) -> kube.Knobs:
    """The manifests' knobs for this 2-CPU, GPU-less machine, under a job name of its own."""
    name = f"tb{uuid.uuid4().hex[:6]}"
    values: dict[str, Any] = {
        "name": name, "claim": f"{name}-runs", "image": image, "nodes": NODES,
        "nproc": NPROC[kind], "cpu": "1", "memory": "4Gi", "shm": "1Gi", "args": QUICK,
    }  # fmt: skip
    return kube.Knobs(**(values | changes))


def pytorchjob(k: kube.Knobs) -> list[dict[str, Any]]:
    return kube.pytorchjob_pods(kube.set_pytorchjob_knobs(kube.load("pytorchjob.yaml"), k))


def trainjob(k: kube.Knobs) -> list[dict[str, Any]]:
    return kube.trainjob_pods(kube.set_trainjob_knobs(kube.load("trainjob.yaml"), k))


@dataclass(frozen=True)
class Finished:
    """A job whose pods have all exited."""

    # {container: exit code}
    codes: dict[str, int]
    # Every container's output.
    logs: str
    # `podman inspect` of each training container.
    inspected: list[dict[str, Any]]
    # run_dir/summary.json, or None when the run did not finish.
    summary: dict[str, Any] | None
    # The job's name.
    name: str


def play(k: kube.Knobs, render: Render, network: str, tmp: Path) -> kube.Played:
    claim = kube.set_pvc_knobs(kube.load("pvc.yaml"), k)
    pods = render(k)
    container = pods[0]["spec"]["containers"][0]["name"]
    names = [kube.container_name(pod, container) for pod in pods]
    return kube.play([claim, *pods], names, network=network, file=tmp / f"{k.name}.yaml")


def finish(played: kube.Played, k: kube.Knobs) -> Finished:
    codes = kube.wait(played)
    summary_file = kube.volume_path(k.claim) / "trainbox" / "summary.json"
    return Finished(
        codes=codes,
        logs=kube.logs(played),
        inspected=[kube.inspect(name) for name in played.containers],
        summary=json.loads(summary_file.read_text()) if summary_file.exists() else None,
        name=k.name,
    )


@contextlib.contextmanager
def job_volumes(played: list[kube.Played]) -> Iterator[None]:
    """Take every played job down and remove its volumes at the end."""
    try:
        yield
    finally:
        for each in played:
            kube.down(each)
            kube.remove_volumes(*each.volumes)


def tail(logs: str) -> str:
    """The end of `logs`, for an assertion's message."""
    return logs[-8000:]


def events(logs: str, name: str) -> list[dict[str, Any]]:
    """The JSON log records called `name` in `logs`."""
    found = []
    for line in logs.splitlines():
        if line.startswith("{") and f'"event": "{name}"' in line:
            found.append(json.loads(line))
    return found


@pytest.fixture(scope="module")
def network() -> Iterator[str]:
    with kube.network() as name:
        yield name


@pytest.fixture(scope="module")
def torchrun_sha(built_image: str) -> Iterator[Callable[..., str]]:
    """params_sha256 of the same run under torchrun in the same image, by world size (and the
    run's arguments, QUICK unless given)."""
    volume = f"tb{uuid.uuid4().hex[:6]}-torchrun"
    podman("volume", "create", volume)
    found: dict[tuple[int, tuple[str, ...]], str] = {}

    def sha(world: int, args: tuple[str, ...] = QUICK) -> str:
        if (world, args) not in found:
            folder = f"{world}-{len(found)}"
            torchrun = ["torchrun", "--standalone", f"--nproc-per-node={world}", "--no-python"]
            run = ["trainbox", "run", f"run_dir=/runs/{folder}", *args]
            kube.run_in_image(built_image, volume, [*torchrun, *run])
            summary = kube.volume_path(volume) / folder / "summary.json"
            found[world, args] = json.loads(summary.read_text())["params_sha256"]
        return found[world, args]

    try:
        yield sha
    finally:
        kube.remove_volumes(volume)


def run_job(render: Render, image: str, network: str, tmp: Path) -> Iterator[Finished]:
    k = knobs(image, render.__name__)
    played = play(k, render, network, tmp)
    with job_volumes([played]):
        yield finish(played, k)


@pytest.fixture(scope="module")
def pytorchjob_run(
    built_image: str, network: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Finished]:
    yield from run_job(pytorchjob, built_image, network, tmp_path_factory.mktemp("pj"))


@pytest.fixture(scope="module")
def trainjob_run(
    built_image: str, network: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Finished]:
    yield from run_job(trainjob, built_image, network, tmp_path_factory.mktemp("tj"))


@pytest.mark.parametrize(
    ("kind", "flavor"), [("pytorchjob", "pytorchjob"), ("trainjob", "trainjob")]
)
def test_the_pods_train_like_torchrun(
    kind: str, flavor: str, request: pytest.FixtureRequest, torchrun_sha: Callable[..., str]
) -> None:
    finished: Finished = request.getfixturevalue(f"{kind}_run")
    assert set(finished.codes.values()) == {0}, tail(finished.logs)
    # Each pod's trainbox found its operator's variables.
    flavors = {launch["flavor"] for launch in events(finished.logs, "launch")}
    assert flavor in flavors, tail(finished.logs)
    world = NODES * NPROC[kind]
    assert finished.summary is not None
    assert (finished.summary["world_size"], finished.summary["steps"]) == (world, 40)
    assert finished.summary["params_sha256"] == torchrun_sha(world)


@pytest.fixture(scope="module")
def fsdp_run(
    built_image: str, network: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Finished]:
    """The PyTorchJob with train.strategy=fsdp: one rank per pod, each holding half the model."""
    k = knobs(built_image, "pytorchjob", args=FSDP)
    played = play(k, pytorchjob, network, tmp_path_factory.mktemp("pj-fsdp"))
    with job_volumes([played]):
        yield finish(played, k)


def test_sharded_pods_train_like_torchrun(
    fsdp_run: Finished, torchrun_sha: Callable[..., str]
) -> None:
    assert set(fsdp_run.codes.values()) == {0}, tail(fsdp_run.logs)
    assert fsdp_run.summary is not None
    assert (fsdp_run.summary["world_size"], fsdp_run.summary["steps"]) == (NODES, 40)
    # Each pod wrote its own shards of the last checkpoint.
    last = kube.volume_path(fsdp_run.name + "-runs") / "trainbox" / "checkpoints"
    assert sorted(p.name for p in (last / "step-00000040.dcp").glob("__*_0.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert fsdp_run.summary["params_sha256"] == torchrun_sha(NODES, FSDP)


@pytest.mark.parametrize("run", ["pytorchjob_run", "trainjob_run"])
def test_the_pods_run_as_the_manifest_s_security_context_says(
    run: str, request: pytest.FixtureRequest
) -> None:
    finished: Finished = request.getfixturevalue(run)
    for inspected in finished.inspected:
        assert inspected["Config"]["User"] == "1000:1000"  # runAsUser, runAsGroup
        assert inspected["EffectiveCaps"] in (None, [])  # capabilities.drop: [ALL]
        # allowPrivilegeEscalation: false
        assert "no-new-privileges" in inspected["HostConfig"]["SecurityOpt"]


@pytest.mark.parametrize("run", ["pytorchjob_run", "trainjob_run"])
def test_the_pods_get_the_manifest_s_limits_and_volumes(
    run: str, request: pytest.FixtureRequest
) -> None:
    finished: Finished = request.getfixturevalue(run)
    for inspected in finished.inspected:
        host = inspected["HostConfig"]
        assert host["CpuQuota"] / host["CpuPeriod"] == 1.0  # limits.cpu: "1"
        assert host["Memory"] == 4 * 2**30  # limits.memory: 4Gi
        mounts = {mount["Destination"]: mount for mount in inspected["Mounts"]}
        assert mounts["/runs"]["Name"].endswith("-runs")  # the claim
        assert mounts["/dev/shm"]["Name"].endswith("-dshm")  # the memory emptyDir's stand-in


def test_each_rank_plans_its_threads_from_the_pod_s_cpu_limit(pytorchjob_run: Finished) -> None:
    pinned = events(pytorchjob_run.logs, "pinned")
    assert len(pinned) == NODES, tail(pytorchjob_run.logs)
    for plan in pinned:
        # The machine has 2 CPUs, but the pod's cgroup allows 1: one torch thread, not two.
        assert (plan["budget"], plan["num_threads"]) == (1, 1), plan
        assert any("cgroup quota 1 CPUs" in note for note in plan["notes"]), plan


def test_the_ranks_of_a_pod_share_its_cpu_limit(trainjob_run: Finished) -> None:
    pinned = events(trainjob_run.logs, "pinned")
    assert len(pinned) == NODES * NPROC["trainjob"], tail(trainjob_run.logs)
    for plan in pinned:
        assert plan["num_threads"] == 1, plan
        assert any("cgroup quota (1 CPUs)" in note for note in plan["notes"]), plan


def wait_for_checkpoint(container: str, step: int) -> None:
    """Follow `container`'s log until rank 0 says the checkpoint of `step` is written."""
    argv = ["podman", "logs", "-f", container]
    with subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as logs:
        assert logs.stderr is not None
        try:
            for line in logs.stderr:
                record = json.loads(line) if line.startswith("{") else {}
                if record.get("event") == "checkpoint" and record.get("step") == step:
                    return
        finally:
            logs.kill()
    raise AssertionError(f"{container} ended before the checkpoint of step {step}")


@pytest.fixture(scope="module")
def killed_then_resubmitted(
    built_image: str, network: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Finished, Finished]]:
    """The Worker pod killed after step 20's checkpoint, then the same job applied again."""
    tmp = tmp_path_factory.mktemp("kill")
    k = knobs(built_image, "pytorchjob", env={"TRAINBOX_FAULT": STALL})
    played = [play(k, pytorchjob, network, tmp)]
    with job_volumes(played):
        wait_for_checkpoint(played[0].containers[0], step=20)
        # What a lost node looks like: no SIGTERM, no grace period.
        podman("pod", "kill", "--signal", "KILL", f"{k.name}-worker-0")
        killed = finish(played[0], k)
        kube.down(played[0])
        again = replace(k, env={})
        played.append(play(again, pytorchjob, network, tmp))
        yield killed, finish(played[1], again)


def test_a_killed_pod_stops_the_others_with_exit_4_naming_it(
    killed_then_resubmitted: tuple[Finished, Finished],
) -> None:
    killed, _ = killed_then_resubmitted
    master, worker = killed.codes.values()
    assert (master, worker) == (4, 137), tail(killed.logs)
    master_log = killed.logs.split("\n--- ")[0]
    error = master_log.strip().splitlines()[-1]
    assert error.startswith("trainbox: error: "), tail(master_log)
    # The rank is named with its Kubernetes node (the downward API's spec.nodeName): the pods
    # of one job here all run on this host.
    assert f"rank 1 ({kube.NODE_NAME})" in error
    # Its silence shows it died rather than stalled, so the HINT names the node to cordon.
    assert "HINT: " in error
    assert f"`kubectl cordon {kube.NODE_NAME}`" in error, error


def test_the_resubmitted_job_resumes_from_the_claim_to_the_same_parameters(
    killed_then_resubmitted: tuple[Finished, Finished], torchrun_sha: Callable[..., str]
) -> None:
    _, again = killed_then_resubmitted
    assert set(again.codes.values()) == {0}, tail(again.logs)
    assert [resumed["step"] for resumed in events(again.logs, "resumed")] == [20, 20]
    assert again.summary is not None
    assert again.summary["steps"] == 40
    assert again.summary["params_sha256"] == torchrun_sha(NODES * NPROC["pytorchjob"])
