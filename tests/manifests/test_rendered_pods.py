"""The pods tests/container/kube.py renders from k8s/ are Kubernetes Pods, keep every field of the
manifests' pod templates, and carry exactly the operators' variables and DNS names."""

from __future__ import annotations

from typing import Any

import pytest

import kubeflow_rules as rules
from container import kube

KNOBS = kube.Knobs(
    name="tj", claim="tj-runs", image="img", nodes=3, nproc=2, cpu="1", memory="4Gi", shm="1Gi",
    args=("train.max_steps=5",), env={"TRAINBOX_FAULT": "stall:rank=1:step=2"},
)  # fmt: skip


def pytorchjob() -> list[dict[str, Any]]:
    return kube.pytorchjob_pods(kube.set_pytorchjob_knobs(kube.load("pytorchjob.yaml"), KNOBS))


def trainjob() -> list[dict[str, Any]]:
    return kube.trainjob_pods(kube.set_trainjob_knobs(kube.load("trainjob.yaml"), KNOBS))


# The -s3 manifests with their bucket and Secret set as a test sets them.
S3_KNOBS = kube.Knobs(
    name="tj", claim="unused", image="img", nodes=2, nproc=1, cpu="1", memory="4Gi", shm="1Gi",
    run_dir="s3://runs/trainbox", secret="tj-s3", env={"AWS_ENDPOINT_URL": "http://10.89.0.1:9000"},
)  # fmt: skip


def pytorchjob_s3() -> list[dict[str, Any]]:
    job = kube.set_pytorchjob_knobs(kube.load("pytorchjob-s3.yaml"), S3_KNOBS)
    return kube.pytorchjob_pods(job)


def trainjob_s3() -> list[dict[str, Any]]:
    return kube.trainjob_pods(kube.set_trainjob_knobs(kube.load("trainjob-s3.yaml"), S3_KNOBS))


RENDERS = {
    "pytorchjob": pytorchjob,
    "trainjob": trainjob,
    "pytorchjob-s3": pytorchjob_s3,
    "trainjob-s3": trainjob_s3,
}


def env(pod: dict[str, Any]) -> dict[str, str]:
    """The container's plain variables (not those from a Secret)."""
    items = pod["spec"]["containers"][0]["env"]
    return {item["name"]: item["value"] for item in items if "value" in item}


@pytest.mark.parametrize("kind", RENDERS)
def test_every_rendered_pod_is_a_valid_kubernetes_pod(kind: str) -> None:
    for pod in RENDERS[kind]():
        assert rules.k8s_schema_problems_for(pod, "pod-v1.json") == [], pod["metadata"]["name"]


def test_pytorchjob_pods_are_the_master_then_the_workers() -> None:
    names = [pod["metadata"]["name"] for pod in pytorchjob()]
    assert names == ["tj-master-0", "tj-worker-0", "tj-worker-1"]
    assert [pod["spec"]["hostname"] for pod in pytorchjob()] == names


def test_pytorchjob_pods_keep_the_template_as_shipped() -> None:
    template = kube.set_pytorchjob_knobs(kube.load("pytorchjob.yaml"), KNOBS)["spec"][
        "pytorchReplicaSpecs"
    ]["Worker"]["template"]["spec"]
    pod = pytorchjob()[1]["spec"]
    for key in ("securityContext", "volumes", "terminationGracePeriodSeconds"):
        assert pod[key] == template[key]
    shipped, rendered = template["containers"][0], pod["containers"][0]
    for key in ("image", "command", "args", "resources", "securityContext", "volumeMounts"):
        assert rendered[key] == shipped[key]
    assert pod["restartPolicy"] == "Never"  # what the operator makes of ExitCode


def test_pytorchjob_pods_get_the_operator_s_variables() -> None:
    worker = env(pytorchjob()[2])
    assert worker["MASTER_ADDR"] == worker["PET_MASTER_ADDR"] == "tj-master-0"
    assert (worker["RANK"], worker["WORLD_SIZE"], worker["PET_NNODES"]) == ("2", "6", "3")
    assert worker["PET_NPROC_PER_NODE"] == "2"
    assert worker["NCCL_DEBUG"] == "WARN"  # the manifest's own
    assert worker["TRAINBOX_FAULT"] == "stall:rank=1:step=2"  # the test's


@pytest.mark.parametrize("kind", RENDERS)
def test_every_pod_gets_its_node_s_name_as_the_kubelet_resolves_spec_node_name(kind: str) -> None:
    # The manifests ask the downward API for it: the exit-3/4 hint names the node to cordon.
    assert {env(pod)["TRAINBOX_NODE_NAME"] for pod in RENDERS[kind]()} == {kube.NODE_NAME}


def test_trainjob_pods_are_named_as_the_jobset_s_headless_service_resolves_them() -> None:
    pods = trainjob()
    assert [pod["metadata"]["name"] for pod in pods] == [
        "tj-node-0-0.tj",
        "tj-node-0-1.tj",
        "tj-node-0-2.tj",
    ]
    assert [pod["spec"]["hostname"] for pod in pods] == [
        "tj-node-0-0",
        "tj-node-0-1",
        "tj-node-0-2",
    ]
    assert {pod["spec"]["subdomain"] for pod in pods} == {"tj"}
    assert env(pods[2])["PET_MASTER_ADDR"] == pods[0]["metadata"]["name"]


def test_trainjob_pods_merge_the_runtime_patch_into_the_trainer_container() -> None:
    job = kube.set_trainjob_knobs(kube.load("trainjob.yaml"), KNOBS)
    trainer = job["spec"]["trainer"]
    pod = trainjob()[1]["spec"]
    container = pod["containers"][0]
    assert container["name"] == "node"
    assert (container["command"], container["args"]) == (trainer["command"], trainer["args"])
    assert container["resources"] == trainer["resourcesPerNode"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert [mount["mountPath"] for mount in container["volumeMounts"]] == ["/dev/shm", "/runs"]
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["terminationGracePeriodSeconds"] == 120
    assert env(trainjob()[1])["PET_NODE_RANK"] == "1"


def test_podman_gets_a_tmpfs_volume_of_the_size_limit_for_each_memory_empty_dir() -> None:
    pods, volumes = kube.for_podman(pytorchjob())
    assert [volume.name for volume in volumes] == [
        "tj-master-0-dshm",
        "tj-worker-0-dshm",
        "tj-worker-1-dshm",
    ]
    assert {(volume.pages, volume.uid, volume.gid) for volume in volumes} == {
        (2**30 // 4096, 1000, 1000)
    }
    dshm = next(v for v in pods[0]["spec"]["volumes"] if v["name"] == "dshm")
    assert dshm == {"name": "dshm", "persistentVolumeClaim": {"claimName": "tj-master-0-dshm"}}


@pytest.mark.parametrize("kind", ["pytorchjob-s3", "trainjob-s3"])
def test_object_store_pods_keep_the_bucket_the_secret_and_the_working_copy(kind: str) -> None:
    for pod in RENDERS[kind]():
        container = pod["spec"]["containers"][0]
        assert "run_dir=s3://runs/trainbox" in container["args"]
        assert env(pod)["AWS_ENDPOINT_URL"] == "http://10.89.0.1:9000"
        secrets = [s["secretRef"]["name"] for s in container.get("envFrom", [])]
        secrets += [
            item["valueFrom"]["secretKeyRef"]["name"]
            for item in container["env"]
            if "secretKeyRef" in item.get("valueFrom", {})
        ]
        assert set(secrets) == {"tj-s3"}  # the Secret knob reaches every reference
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        assert set(mounts) == {"/dev/shm", "/tmp"}
        volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
        assert volumes[mounts["/tmp"]]["emptyDir"] == {"sizeLimit": "100Gi"}


def test_podman_gets_a_volume_of_its_own_for_each_pod_s_disk_empty_dir() -> None:
    # podman 4.3 names an emptyDir's volume after the pod's volume alone: pods would share /tmp.
    pods, _ = kube.for_podman(pytorchjob_s3())
    for pod in pods:
        name = f"{pod['metadata']['name']}-tmp"
        [mount] = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == name]
        assert mount["mountPath"] == "/tmp"
        assert {"name": name, "emptyDir": {"sizeLimit": "100Gi"}} in pod["spec"]["volumes"]


def test_the_secret_is_the_one_kubectl_create_secret_generic_makes() -> None:
    secret = kube.secret("tj-s3", {"AWS_ACCESS_KEY_ID": "testing"})
    assert rules.k8s_schema_problems_for(secret, "secret-v1.json") == []
    assert secret["data"] == {"AWS_ACCESS_KEY_ID": "dGVzdGluZw=="}
