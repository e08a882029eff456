"""k8s/pytorchjob-s3.yaml, rendered into the pods its operator creates and run with `podman kube
play` from the image built here, with run_dir in a bucket of a real S3-compatible server on this
host (moto's, tests/s3server.py). There is no PersistentVolumeClaim: the pods share no volume,
each has its own /tmp (the working copy) and /dev/shm, and the bucket is the only place the run
lives.

Only the knobs a user edits change, as in test_k8s_pods.py (2 pods of 1 CPU, no GPU, a short
run), plus the ones this manifest adds: the bucket in `run_dir=`, the Secret's name, and
AWS_ENDPOINT_URL, the manifest's commented knob for a store that is not AWS S3. The Secret holds
the server's keys, as `kubectl create secret generic` in the manifest's first lines makes it
(tests/container/kube.py says how podman gets it). The server listens on the host's address on
the pods' network (kube.host_address), so that the pods reach it as pods reach a store in the
cloud: over the network, with credentials from their environment.
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import tiers
from container import kube
from container.image import podman
from container.test_k8s_pods import NODES, QUICK, Finished, tail

pytestmark = pytest.mark.slow

# The run's files that summary.json's arrival promises are in the bucket too.
RUN_FILES = ("summary.json", "config.yaml", "run.json", "metrics.jsonl")
# QUICK's last step: its checkpoint, then the marker that says it is complete, uploaded last.
LAST_CHECKPOINT = "checkpoints/step-00000040.pt"
MARKER = ".sha256"
# The log line of a run found complete at its start (trainbox.train.resume.start.already_complete).
ALREADY_COMPLETE = "run already complete"


def s3_knobs(image: str, endpoint: str) -> kube.Knobs:
    """The manifest's knobs for this machine, with a bucket and a Secret named after the job."""
    name = f"tb{uuid.uuid4().hex[:6]}"
    return kube.Knobs(
        name=name, claim=f"{name}-runs", image=image, nodes=NODES, nproc=1, cpu="1",
        memory="4Gi", shm="1Gi", args=QUICK, run_dir=f"s3://{name}/trainbox",
        secret=f"{name}-s3", env={"AWS_ENDPOINT_URL": endpoint},
    )  # fmt: skip


def render(k: kube.Knobs) -> list[dict[str, Any]]:
    job = kube.set_pytorchjob_knobs(kube.load("pytorchjob-s3.yaml"), k)
    return kube.pytorchjob_pods(job)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """A podman network, and an S3 server on the host that its pods reach: (network, server)."""
    if importlib.util.find_spec("moto") is None:
        tiers.unavailable("moto is not installed (the S3 server the object-store tests use)")
    from s3server import S3Server

    log = tmp_path_factory.mktemp("s3") / "moto.log"
    with (
        kube.network() as network,
        kube.host_address(network) as host,
        log.open("wb") as requests,
        S3Server.start(host=host, log=requests) as server,
    ):
        yield network, server


def bucket_of(k: kube.Knobs) -> str:
    return k.name


def tmp_volumes(pods: list[dict[str, Any]]) -> list[str]:
    """The podman volumes the pods' /tmp emptyDirs become (kube.for_podman)."""
    return [f"{pod['metadata']['name']}-tmp" for pod in pods]


@pytest.fixture(scope="module")
def trained_then_played_again(
    built_image: str, store: tuple[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Finished, Finished, dict[str, Any]]]:
    """The job applied, run to its end and deleted; then applied again to fresh pods.

    Yields both runs and what the second found: the bucket's keys before it, and whether any
    pod's /tmp of the first run was still there.
    """
    network, server = store
    tmp = tmp_path_factory.mktemp("pj-s3")
    k = s3_knobs(built_image, server.endpoint)
    server.make_bucket(bucket_of(k))
    # kubectl create secret generic NAME --from-literal=AWS_ACCESS_KEY_ID=... --from-literal=...
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    secret = kube.secret(str(k.secret), {key: server.env[key] for key in keys})
    pods = render(k)
    names = [kube.container_name(pod, "pytorch") for pod in pods]
    played: list[kube.Played] = []
    finished: list[Finished] = []
    found: dict[str, Any] = {}
    try:
        for attempt in range(2):
            if attempt == 1:
                found["keys"] = server.keys(bucket_of(k))
                found["leftover_tmp"] = [
                    name
                    for name in tmp_volumes(pods)
                    if podman("volume", "exists", name, check=False).returncode == 0
                ]
            played.append(kube.play([secret, *pods], names, network=network, file=tmp / "job.yaml"))
            codes = kube.wait(played[-1])
            summary = None
            if "trainbox/summary.json" in server.keys(bucket_of(k), "trainbox/summary.json"):
                summary = json.loads(server.read(bucket_of(k), "trainbox/summary.json"))
            finished.append(
                Finished(
                    codes=codes,
                    logs=kube.logs(played[-1]),
                    inspected=[kube.inspect(name) for name in names],
                    summary=summary,
                    name=k.name,
                )
            )
            kube.down(played[-1])  # `kubectl delete pytorchjob`: the pods and their /tmp go
        yield finished[0], finished[1], found
    finally:
        for each in played:
            kube.down(each)
            kube.remove_volumes(*each.volumes)
            kube.remove_secrets(*each.secrets)


@pytest.fixture(scope="module")
def first(trained_then_played_again: tuple[Finished, Finished, dict[str, Any]]) -> Finished:
    return trained_then_played_again[0]


def test_the_pods_train_to_the_end_with_run_dir_in_the_bucket(first: Finished) -> None:
    assert set(first.codes.values()) == {0}, tail(first.logs)
    assert first.summary is not None, tail(first.logs)
    assert (first.summary["world_size"], first.summary["steps"]) == (NODES, 40)


def test_the_pods_share_no_volume(first: Finished) -> None:
    mounts = [
        {mount["Destination"]: mount["Name"] for mount in inspected["Mounts"]}
        for inspected in first.inspected
    ]
    # /dev/shm and the working copy, each the pod's own: nothing a PVC would have shared.
    assert [set(each) for each in mounts] == [{"/dev/shm", "/tmp"}] * NODES
    names = [name for each in mounts for name in each.values()]
    assert len(set(names)) == len(names), mounts


def test_the_bucket_holds_the_run_s_files_and_its_complete_checkpoint(
    trained_then_played_again: tuple[Finished, Finished, dict[str, Any]],
) -> None:
    first, _, found = trained_then_played_again
    assert set(first.codes.values()) == {0}, tail(first.logs)
    keys = {key.removeprefix("trainbox/") for key in found["keys"]}
    assert set(RUN_FILES) <= keys, sorted(keys)
    assert {LAST_CHECKPOINT, LAST_CHECKPOINT + MARKER} <= keys, sorted(keys)
    # Every checkpoint left in the bucket is a complete one.
    checkpoints = {key for key in keys if key.startswith("checkpoints/") and key.endswith(".pt")}
    assert {key + MARKER for key in checkpoints} <= keys, sorted(keys)


def test_fresh_pods_find_the_run_complete_from_the_bucket_alone(
    trained_then_played_again: tuple[Finished, Finished, dict[str, Any]],
) -> None:
    first, again, found = trained_then_played_again
    # Nothing of the first pods' /tmp was left for the second: only the bucket carried the run.
    assert found["leftover_tmp"] == []
    assert set(again.codes.values()) == {0}, tail(again.logs)
    assert ALREADY_COMPLETE in again.logs, tail(again.logs)
    assert again.summary == first.summary  # the run's files are left as they are


def test_the_secret_reaches_the_pods_as_their_environment(first: Finished) -> None:
    for inspected in first.inspected:
        env = dict(item.split("=", 1) for item in inspected["Config"]["Env"])
        assert env["AWS_ACCESS_KEY_ID"] == "testing"  # from the Secret, through envFrom
        assert env["AWS_ENDPOINT_URL"].startswith("http://")
