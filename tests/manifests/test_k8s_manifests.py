"""k8s/ manifests against strict CRD schemas, the operators' webhook rules and our house rules."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

import kubeflow_rules as rules

K8S = rules.K8S_DIR
# The jobs with run_dir in a bucket (S3) instead of on the claim: the same pods otherwise.
OBJECT_STORE_JOBS = {"pytorchjob-s3.yaml": "pytorchjob.yaml", "trainjob-s3.yaml": "trainjob.yaml"}
JOBS = ("pytorchjob.yaml", "trainjob.yaml", "pytorchjob-elastic.yaml", *OBJECT_STORE_JOBS)
MANIFESTS = (*JOBS, "pvc.yaml")
PLACEHOLDER = "registry.example.com/trainbox@sha256:" + "0" * 64


def load(name: str) -> dict[str, Any]:
    """A fresh copy of a shipped manifest (or kustomization)."""
    return rules.load_yaml(K8S / name)


def kind_of(name: str) -> str:
    return load(name)["kind"]


def check(rule: str, name: str, doc: dict[str, Any]) -> list[str]:
    """Run one named rule on `doc`, a possibly mutated copy of the file `name`."""
    if rule == "kustomization":
        return rules.kustomization_problems(doc, K8S, [load(job) for job in JOBS])
    if rule == "claim":
        job, pvc = (load("pytorchjob.yaml"), doc) if name == "pvc.yaml" else (doc, load("pvc.yaml"))
        return rules.claim_problems(job, pvc)
    return rules.RULES[kind_of(name)][rule](doc)


# --- the shipped files pass ----------------------------------------------------------------------

SHIPPED = [(name, rule) for name in MANIFESTS for rule in rules.RULES[kind_of(name)]]
SHIPPED += [(job, "claim") for job in JOBS] + [("kustomization.yaml", "kustomization")]


@pytest.mark.parametrize(("name", "rule"), SHIPPED, ids=[f"{n}-{r}" for n, r in SHIPPED])
def test_shipped_file_passes(name: str, rule: str) -> None:
    assert check(rule, name, load(name)) == []


@pytest.mark.parametrize("name", MANIFESTS)
def test_kustomization_or_its_alternative_lists_each_manifest(name: str) -> None:
    # trainjob.yaml is the commented-out alternative to pytorchjob.yaml: one job per apply.
    text = (K8S / "kustomization.yaml").read_text()
    assert re.search(rf"^\s*#?\s*- {re.escape(name)}\b", text, re.MULTILINE)


def test_kustomize_images_reach_the_trainjob_image() -> None:
    config = load("kustomizeconfig.yaml")
    [spec] = [spec for spec in config["images"] if spec["kind"] == "TrainJob"]
    assert rules.get(load("trainjob.yaml"), *spec["path"].split("/")) == PLACEHOLDER


@pytest.mark.parametrize("name", JOBS)
def test_shipped_jobs_use_the_placeholder_image(name: str) -> None:
    # One image name everywhere, so that kustomization.yaml's single `images:` entry pins them all.
    assert set(rules.job_images(load(name))) == {PLACEHOLDER}


# --- run_dir in a bucket instead of on a claim ---------------------------------------------------


def walk(node: Any) -> Iterator[tuple[Any, Any]]:
    """Every (key, value) pair in a document, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def training_pods(name: str) -> list[rules.TrainingPod]:
    job = load(name)
    if job["kind"] == "TrainJob":
        return [rules.trainjob_pod(job)]
    return list(rules.pytorchjob_pods(job).values())


@pytest.mark.parametrize("name", OBJECT_STORE_JOBS)
def test_object_store_job_uses_no_persistent_volume_claim(name: str) -> None:
    # Nothing to provision: the default ReadWriteOnce class of EKS, GKE or AKS is no obstacle.
    assert [key for key, _ in walk(load(name)) if key == "persistentVolumeClaim"] == []


@pytest.mark.parametrize("name", OBJECT_STORE_JOBS)
def test_object_store_job_puts_run_dir_in_a_bucket(name: str) -> None:
    for pod in training_pods(name):
        run_dirs = [arg for arg in pod.container["args"] if arg.startswith("run_dir=")]
        assert run_dirs == ["run_dir=s3://my-bucket/trainbox"]


def test_object_store_pytorchjob_takes_the_whole_secret_as_its_environment() -> None:
    for pod in training_pods("pytorchjob-s3.yaml"):
        assert pod.container["envFrom"] == [
            {"secretRef": {"name": "trainbox-s3", "optional": False}}
        ]


def test_object_store_trainjob_takes_each_key_from_the_secret() -> None:
    # A TrainJob has no envFrom: one secretKeyRef per key the `kubectl create secret` sets.
    [pod] = training_pods("trainjob-s3.yaml")
    refs = {
        item["name"]: item["valueFrom"]["secretKeyRef"]
        for item in pod.container["env"]
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    assert refs == {
        key: {"name": "trainbox-s3", "key": key, "optional": False}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }


@pytest.mark.parametrize("name", OBJECT_STORE_JOBS)
def test_object_store_job_keeps_each_node_s_working_copy_in_a_tmp_empty_dir(name: str) -> None:
    for pod in training_pods(name):
        [mount] = [m for m in pod.container["volumeMounts"] if m["mountPath"] == "/tmp"]
        [volume] = [v for v in pod.spec["volumes"] if v["name"] == mount["name"]]
        # On the node's disk (no `medium: Memory`), sized for the newest checkpoint twice.
        assert volume == {"name": mount["name"], "emptyDir": {"sizeLimit": "100Gi"}}


@pytest.mark.parametrize("name", OBJECT_STORE_JOBS)
def test_object_store_job_leaves_the_endpoint_for_aws_s3_and_names_a_region(name: str) -> None:
    for pod in training_pods(name):
        env = {item["name"]: item.get("value") for item in pod.container["env"]}
        assert env["AWS_DEFAULT_REGION"] == "us-east-1"
        assert "AWS_ENDPOINT_URL" not in env  # a commented knob, for MinIO, Ceph, R2 or GCS


def without_storage(node: Any) -> Any:
    """`node` without what says where run_dir lives: the run_dir argument, AWS_* variables,
    the Secret, and the `runs` (claim) and `tmp` (working copy) volumes and their mounts."""
    if isinstance(node, list):
        kept = [
            item
            for item in node
            if not (isinstance(item, str) and item.startswith("run_dir="))
            and not (isinstance(item, dict) and str(item.get("name")).startswith("AWS_"))
            and not (isinstance(item, dict) and item.get("name") in ("runs", "tmp"))
        ]
        return [without_storage(item) for item in kept]
    if isinstance(node, dict):
        return {key: without_storage(value) for key, value in node.items() if key != "envFrom"}
    return node


@pytest.mark.parametrize("name", OBJECT_STORE_JOBS)
def test_object_store_job_is_its_pvc_variant_in_every_other_setting(name: str) -> None:
    # Security context, tini, restart policy, shm, resources, TRAINBOX_NODE_NAME: all the same.
    variant, original = load(name), load(OBJECT_STORE_JOBS[name])
    assert rules.first_difference(without_storage(original), without_storage(variant)) is None


def test_object_store_job_takes_irsa_instead_of_the_secret() -> None:
    # EKS: a ServiceAccount annotated with eks.amazonaws.com/role-arn, and no Secret at all.
    job = load("pytorchjob-s3.yaml")
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["serviceAccountName"] = "trainbox"
        del replica["template"]["spec"]["containers"][0]["envFrom"]
    assert rules.all_problems(job) == []


# --- each rule rejects a broken copy, naming the culprit -------------------------------------------

Change = Callable[[dict[str, Any]], None]


def _parent(doc: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    node: Any = doc
    for part in path[:-1]:
        node = node[part]
    return node


def setting(path: tuple[str | int, ...], value: Any) -> Change:
    def change(doc: dict[str, Any]) -> None:
        _parent(doc, path)[path[-1]] = value

    return change


def removing(path: tuple[str | int, ...]) -> Change:
    def change(doc: dict[str, Any]) -> None:
        del _parent(doc, path)[path[-1]]

    return change


def renaming(path: tuple[str | int, ...], new_key: str) -> Change:
    def change(doc: dict[str, Any]) -> None:
        parent = _parent(doc, path)
        parent[new_key] = parent.pop(path[-1])

    return change


def appending(path: tuple[str | int, ...], value: Any) -> Change:
    def change(doc: dict[str, Any]) -> None:
        _parent(doc, path)[path[-1]].append(value)

    return change


def copying(source: tuple[str | int, ...], target: tuple[str | int, ...]) -> Change:
    def change(doc: dict[str, Any]) -> None:
        _parent(doc, target)[target[-1]] = copy.deepcopy(_parent(doc, source)[source[-1]])

    return change


def both(*changes: Change) -> Change:
    def change(doc: dict[str, Any]) -> None:
        for each in changes:
            each(doc)

    return change


def p(*path: str | int) -> str:
    return rules.dotted(path)


REPLICAS = ("spec", "pytorchReplicaSpecs")
MASTER, WORKER = (*REPLICAS, "Master"), (*REPLICAS, "Worker")
MASTER_POD, WORKER_POD = (*MASTER, "template", "spec"), (*WORKER, "template", "spec")
MASTER_C, WORKER_C = (*MASTER_POD, "containers", 0), (*WORKER_POD, "containers", 0)
NODE_POD = (
    "spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", 0,
    "template", "spec", "template", "spec",
)  # fmt: skip
NODE_C = (*NODE_POD, "containers", 0)
TRAINER = ("spec", "trainer")
GPU = "nvidia.com/gpu"
TAGGED = "registry.example.com/trainbox:1.0"


@dataclass(frozen=True)
class Mutation:
    id: str
    name: str  # the shipped file it breaks
    change: Change
    rule: str  # the rule that must reject it
    culprit: str  # text the rule's message must contain


MUTATIONS = [
    # PyTorchJob, strict CRD schema
    Mutation("typo-cleanpodpolicy", "pytorchjob.yaml", renaming(("spec", "runPolicy", "cleanPodPolicy"), "cleanpodpolicy"), "crd", "spec.runPolicy.cleanpodpolicy: unknown field"),
    Mutation("nprocPerNode-int", "pytorchjob.yaml", setting(("spec", "nprocPerNode"), 8), "crd", "spec.nprocPerNode: 8 is not of type 'string'"),
    Mutation("gpu-limit-eight", "pytorchjob.yaml", setting((*MASTER_C, "resources", "limits", GPU), "eight"), "crd", f"{p(*MASTER_C, 'resources', 'limits', GPU)}: 'eight' does not match"),
    Mutation("backoffLimit-string", "pytorchjob.yaml", setting(("spec", "runPolicy", "backoffLimit"), "three"), "crd", "spec.runPolicy.backoffLimit: 'three' is not of type 'integer'"),
    Mutation("container-unknown-key-crd", "pytorchjob.yaml", setting((*MASTER_C, "imagePullPolicyy"), "Always"), "crd", f"{p(*MASTER_C, 'imagePullPolicyy')}: unknown field"),
    # PyTorchJob, webhook
    Mutation("container-renamed", "pytorchjob.yaml", setting((*MASTER_C, "name"), "trainer"), "webhook", f"{p(*MASTER_POD, 'containers')}: Required value: must have at least one container with name pytorch"),
    Mutation("master-replicas-2", "pytorchjob.yaml", setting((*MASTER, "replicas"), 2), "webhook", f"{p(*MASTER, 'replicas')}: Forbidden: must be 1"),
    Mutation("master-replicas-unset", "pytorchjob.yaml", removing((*MASTER, "replicas")), "webhook", f"{p(*MASTER, 'replicas')}: Forbidden: must be 1"),
    Mutation("worker-replicas-0", "pytorchjob.yaml", setting((*WORKER, "replicas"), 0), "webhook", f"{p(*WORKER, 'replicas')}: Forbidden: must be at least 1"),
    Mutation("replica-type-launcher", "pytorchjob.yaml", copying(WORKER, (*REPLICAS, "Launcher")), "webhook", f'{p(*REPLICAS, "Launcher")}: Unsupported value: "Launcher"'),
    Mutation("image-empty", "pytorchjob.yaml", setting((*MASTER_C, "image"), ""), "webhook", f"{p(*MASTER_C, 'image')}: Required value"),
    Mutation("name-not-dns1035", "pytorchjob.yaml", setting(("metadata", "name"), "Trainbox_1"), "webhook", "metadata.name: 'Trainbox_1' is not a DNS-1035 label"),
    Mutation("elastic-without-worker", "pytorchjob.yaml", both(removing(WORKER), setting(("spec", "elasticPolicy"), {"rdzvBackend": "c10d"})), "webhook", f"{p(*WORKER)}: Required value: must be configured if elastic policy is used"),
    Mutation("elastic-nproc-twice", "pytorchjob.yaml", setting(("spec", "elasticPolicy"), {"nProcPerNode": 8}), "webhook", "spec.elasticPolicy.nProcPerNode: Forbidden: must not be used with spec.nprocPerNode"),
    Mutation("managedBy-unknown", "pytorchjob.yaml", setting(("spec", "runPolicy", "managedBy"), "example.com/me"), "webhook", 'spec.runPolicy.managedBy: Unsupported value: "example.com/me"'),
    # PyTorchJob, enums the CRD leaves to prose
    Mutation("restartPolicy-OnFailur", "pytorchjob.yaml", setting((*MASTER, "restartPolicy"), "OnFailur"), "enums", f'{p(*MASTER, "restartPolicy")}: Unsupported value: "OnFailur"'),
    Mutation("cleanPodPolicy-Sometimes", "pytorchjob.yaml", setting(("spec", "runPolicy", "cleanPodPolicy"), "Sometimes"), "enums", 'spec.runPolicy.cleanPodPolicy: Unsupported value: "Sometimes"'),
    Mutation("nprocPerNode-eight", "pytorchjob.yaml", setting(("spec", "nprocPerNode"), "eight"), "enums", "spec.nprocPerNode: 'eight' is not auto, cpu, gpu or a positive integer"),
    # PyTorchJob, house rules
    Mutation("image-by-tag", "pytorchjob.yaml", setting((*MASTER_C, "image"), TAGGED), "house", f"{p(*MASTER_C, 'image')}: '{TAGGED}' is not pinned by digest"),
    Mutation("no-shm-volume", "pytorchjob.yaml", both(removing((*MASTER_POD, "volumes", 0)), removing((*MASTER_C, "volumeMounts", 0))), "house", f"{p(*MASTER_C, 'volumeMounts')}: no volume mounted at /dev/shm"),
    Mutation("shm-on-disk", "pytorchjob.yaml", setting((*WORKER_POD, "volumes", 0, "emptyDir"), {"sizeLimit": "64Gi"}), "house", f"{p(*WORKER_POD, 'volumes', 0, 'emptyDir', 'medium')}: the /dev/shm volume must be an emptyDir with medium: Memory"),
    Mutation("shm-unsized", "pytorchjob.yaml", removing((*MASTER_POD, "volumes", 0, "emptyDir", "sizeLimit")), "house", f"{p(*MASTER_POD, 'volumes', 0, 'emptyDir', 'sizeLimit')}: set a size"),
    Mutation("memory-below-shm", "pytorchjob.yaml", setting((*MASTER_C, "resources", "limits", "memory"), "32Gi"), "house", f"{p(*MASTER_C, 'resources', 'limits', 'memory')}: 32Gi does not exceed the /dev/shm sizeLimit 64Gi"),
    Mutation("gpu-limit-not-nproc", "pytorchjob.yaml", setting((*WORKER_C, "resources", "limits", GPU), 4), "house", f"{p(*WORKER_C, 'resources', 'limits', GPU)}: 4 GPUs, but spec.nprocPerNode is 8"),
    Mutation("nproc-not-gpu-limit", "pytorchjob.yaml", setting(("spec", "nprocPerNode"), "4"), "house", f"{p(*MASTER_C, 'resources', 'limits', GPU)}: 8 GPUs, but spec.nprocPerNode is 4"),
    Mutation("nproc-auto", "pytorchjob.yaml", setting(("spec", "nprocPerNode"), "auto"), "house", "spec.nprocPerNode: 'auto': set the GPU count"),
    Mutation("gpu-request-differs", "pytorchjob.yaml", setting((*MASTER_C, "resources", "requests"), {GPU: 1}), "house", f"{p(*MASTER_C, 'resources', 'requests', GPU)}: 1 differs from the limit 8"),
    Mutation("runAsNonRoot-missing", "pytorchjob.yaml", removing((*MASTER_POD, "securityContext", "runAsNonRoot")), "house", f"{p(*MASTER_POD, 'securityContext', 'runAsNonRoot')}: must be true"),
    Mutation("runAsUser-root", "pytorchjob.yaml", setting((*WORKER_POD, "securityContext", "runAsUser"), 0), "house", f"{p(*WORKER_POD, 'securityContext', 'runAsUser')}: must be 1000"),
    Mutation("seccomp-missing", "pytorchjob.yaml", removing((*MASTER_POD, "securityContext", "seccompProfile")), "house", f"{p(*MASTER_POD, 'securityContext', 'seccompProfile', 'type')}: must be RuntimeDefault"),
    Mutation("privilege-escalation", "pytorchjob.yaml", setting((*MASTER_C, "securityContext", "allowPrivilegeEscalation"), True), "house", f"{p(*MASTER_C, 'securityContext', 'allowPrivilegeEscalation')}: must be false"),
    Mutation("capabilities-kept", "pytorchjob.yaml", removing((*MASTER_C, "securityContext", "capabilities")), "house", f"{p(*MASTER_C, 'securityContext', 'capabilities', 'drop')}: must drop ALL"),
    Mutation("command-python", "pytorchjob.yaml", setting((*MASTER_C, "command"), ["python", "train.py"]), "house", f"{p(*MASTER_C, 'command')}: ['python', 'train.py'] is not ['tini', '--', 'trainbox', 'run']"),
    Mutation("restartPolicy-OnFailure", "pytorchjob.yaml", setting((*WORKER, "restartPolicy"), "OnFailure"), "house", f"{p(*WORKER, 'restartPolicy')}: 'OnFailure': use ExitCode"),
    Mutation("run-dir-off-pvc", "pytorchjob.yaml", setting((*MASTER_C, "args", 0), "run_dir=/tmp/trainbox"), "house", f"{p(*MASTER_C, 'args')}: run_dir=/tmp/trainbox is not under a PVC mount"),
    Mutation("no-pvc", "pytorchjob.yaml", setting((*MASTER_POD, "volumes", 1), {"name": "runs", "emptyDir": {}}), "house", f"{p(*MASTER_C, 'volumeMounts')}: no persistentVolumeClaim is mounted"),
    Mutation("templates-drift", "pytorchjob.yaml", setting((*WORKER_C, "env", 0, "value"), "INFO"), "house", f"{p(*WORKER_C, 'env', 0, 'value')}: differs from the Master's template"),
    # The elastic PyTorchJob (Workers only)
    Mutation("elastic-no-restarts", "pytorchjob-elastic.yaml", removing(("spec", "elasticPolicy", "maxRestarts")), "house", "spec.elasticPolicy.maxRestarts: None: set at least 1"),
    Mutation("elastic-zero-restarts", "pytorchjob-elastic.yaml", setting(("spec", "elasticPolicy", "maxRestarts"), 0), "house", "spec.elasticPolicy.maxRestarts: 0: set at least 1"),
    Mutation("elastic-replicas-above-max", "pytorchjob-elastic.yaml", setting((*WORKER, "replicas"), 5), "house", "spec.elasticPolicy: minReplicas 1, Worker replicas 5, maxReplicas 4"),
    Mutation("elastic-min-unset", "pytorchjob-elastic.yaml", removing(("spec", "elasticPolicy", "minReplicas")), "house", "spec.elasticPolicy: minReplicas None"),
    Mutation("elastic-backend-typo", "pytorchjob-elastic.yaml", renaming(("spec", "elasticPolicy", "rdzvBackend"), "rdzvbackend"), "crd", "spec.elasticPolicy.rdzvbackend: unknown field"),
    Mutation("elastic-worker-shm-drift", "pytorchjob-elastic.yaml", removing((*WORKER_POD, "volumes", 0, "emptyDir", "sizeLimit")), "house", f"{p(*WORKER_POD, 'volumes', 0, 'emptyDir', 'sizeLimit')}: set a size"),
    # PyTorchJob, Kubernetes' own schema
    Mutation("container-unknown-key", "pytorchjob.yaml", setting((*MASTER_C, "imagePullPolicyy"), "Always"), "k8s_schema", f"{p(*MASTER_C, 'imagePullPolicyy')}: unknown field"),
    Mutation("volume-mount-typo", "pytorchjob.yaml", renaming((*WORKER_C, "volumeMounts", 0, "mountPath"), "mountpath"), "k8s_schema", f"{p(*WORKER_C, 'volumeMounts', 0, 'mountpath')}: unknown field"),
    Mutation("metadata-unknown-key", "pytorchjob.yaml", renaming(("metadata", "labels"), "lables"), "k8s_schema", "metadata.lables: unknown field"),
    # TrainJob
    Mutation("trainjob-pet-env", "trainjob.yaml", appending((*TRAINER, "env"), {"name": "PET_NNODES", "value": "3"}), "webhook", f"{p(*TRAINER, 'env', 2, 'name')}: PET_NNODES is reserved"),
    Mutation("trainjob-patch-env", "trainjob.yaml", setting((*NODE_C, "env"), [{"name": "A", "value": "1"}]), "webhook", f"{p(*NODE_C, 'env')}: Forbidden: set node's env in spec.trainer.env"),
    Mutation("trainjob-name", "trainjob.yaml", setting(("metadata", "name"), "train.box"), "webhook", "metadata.name: 'train.box' is not a DNS-1035 label"),
    Mutation("trainjob-runtime-kind", "trainjob.yaml", setting(("spec", "runtimeRef", "kind"), "Runtime"), "webhook", 'spec.runtimeRef.kind: Unsupported value: "Runtime"'),
    Mutation("trainjob-nproc-string", "trainjob.yaml", setting((*TRAINER, "numProcPerNode"), "8"), "crd", "spec.trainer.numProcPerNode: '8' is not of type 'integer'"),
    Mutation("trainjob-typo-numNode", "trainjob.yaml", renaming((*TRAINER, "numNodes"), "numNode"), "crd", "spec.trainer.numNode: unknown field"),
    Mutation("trainjob-patch-resources", "trainjob.yaml", setting((*NODE_C, "resources"), {"limits": {GPU: 8}}), "crd", f"{p(*NODE_C, 'resources')}: unknown field"),
    Mutation("trainjob-runtime-unknown", "trainjob.yaml", setting(("spec", "runtimeRef", "name"), "torch-distributd"), "house", "spec.runtimeRef.name: 'torch-distributd' is not a runtime trainbox is written for"),
    Mutation("trainjob-image-by-tag", "trainjob.yaml", setting((*TRAINER, "image"), TAGGED), "house", f"spec.trainer.image: '{TAGGED}' is not pinned by digest"),
    Mutation("trainjob-gpu-not-nproc", "trainjob.yaml", setting((*TRAINER, "numProcPerNode"), 4), "house", 'spec.trainer.resourcesPerNode.limits["nvidia.com/gpu"]: 8 GPUs, but spec.trainer.numProcPerNode is 4'),
    Mutation("trainjob-no-shm", "trainjob.yaml", both(removing((*NODE_POD, "volumes", 0)), removing((*NODE_C, "volumeMounts", 0))), "house", f"{p(*NODE_C, 'volumeMounts')}: no volume mounted at /dev/shm"),
    Mutation("trainjob-memory-below-shm", "trainjob.yaml", setting((*TRAINER, "resourcesPerNode", "limits", "memory"), "64Gi"), "house", "spec.trainer.resourcesPerNode.limits.memory: 64Gi does not exceed the /dev/shm sizeLimit 64Gi"),
    Mutation("trainjob-runAsNonRoot-missing", "trainjob.yaml", removing((*NODE_POD, "securityContext", "runAsNonRoot")), "house", f"{p(*NODE_POD, 'securityContext', 'runAsNonRoot')}: must be true"),
    Mutation("trainjob-mount-typo", "trainjob.yaml", renaming((*NODE_C, "volumeMounts", 1, "mountPath"), "mountpath"), "k8s_schema", f"{p(*NODE_C, 'volumeMounts', 1, 'mountpath')}: unknown field"),
    Mutation("trainjob-env-typo", "trainjob.yaml", renaming((*TRAINER, "env", 0, "value"), "valeu"), "k8s_schema", f"{p(*TRAINER, 'env', 0, 'valeu')}: unknown field"),
    # run_dir in a bucket
    Mutation("s3-url-malformed", "pytorchjob-s3.yaml", setting((*MASTER_C, "args", 0), "run_dir=s3://My_Bucket"), "house", f"{p(*MASTER_C, 'args')}: run_dir=s3://My_Bucket is not s3://BUCKET/PREFIX"),
    Mutation("s3-no-secret", "pytorchjob-s3.yaml", removing((*WORKER_C, "envFrom")), "house", f"{p(*WORKER_C, 'env')}: AWS_ACCESS_KEY_ID does not come from the Secret 'trainbox-s3'"),
    Mutation("s3-secret-optional", "pytorchjob-s3.yaml", setting((*MASTER_C, "envFrom", 0, "secretRef", "optional"), True), "house", f"{p(*MASTER_C, 'envFrom', 0, 'secretRef', 'optional')}: must not be true"),
    Mutation("s3-no-tmp", "pytorchjob-s3.yaml", removing((*MASTER_C, "volumeMounts", 1)), "house", f"{p(*MASTER_C, 'volumeMounts')}: no volume mounted at /tmp"),
    Mutation("s3-tmp-in-memory", "pytorchjob-s3.yaml", setting((*MASTER_POD, "volumes", 1, "emptyDir", "medium"), "Memory"), "house", f"{p(*MASTER_POD, 'volumes', 1, 'emptyDir')}: the /tmp volume must be an emptyDir on disk"),
    Mutation("s3-tmp-unsized", "pytorchjob-s3.yaml", removing((*WORKER_POD, "volumes", 1, "emptyDir", "sizeLimit")), "house", f"{p(*WORKER_POD, 'volumes', 1, 'emptyDir', 'sizeLimit')}: set a size"),
    Mutation("s3-templates-drift", "pytorchjob-s3.yaml", setting((*WORKER_C, "args", 0), "run_dir=s3://other-bucket/trainbox"), "house", f"{p(*WORKER_C, 'args', 0)}: differs from the Master's template"),
    Mutation("trainjob-s3-key-missing", "trainjob-s3.yaml", removing((*TRAINER, "env", 1)), "house", "spec.trainer.env: AWS_SECRET_ACCESS_KEY does not come from the Secret 'trainbox-s3'"),
    Mutation("trainjob-s3-key-optional", "trainjob-s3.yaml", setting((*TRAINER, "env", 0, "valueFrom", "secretKeyRef", "optional"), True), "house", "spec.trainer.env[0].valueFrom.secretKeyRef.optional: must not be true"),
    Mutation("trainjob-s3-envfrom", "trainjob-s3.yaml", setting((*TRAINER, "envFrom"), [{"secretRef": {"name": "trainbox-s3"}}]), "crd", "spec.trainer.envFrom: unknown field"),
    Mutation("trainjob-s3-patch-envfrom", "trainjob-s3.yaml", setting((*NODE_C, "envFrom"), [{"secretRef": {"name": "trainbox-s3"}}]), "crd", f"{p(*NODE_C, 'envFrom')}: unknown field"),
    # PersistentVolumeClaim, and how the job uses it
    Mutation("pvc-typo", "pvc.yaml", renaming(("spec", "accessModes"), "accesModes"), "k8s_schema", "spec.accesModes: unknown field"),
    Mutation("pvc-read-write-once", "pvc.yaml", setting(("spec", "accessModes"), ["ReadWriteOnce"]), "claim", "spec.accessModes: ['ReadWriteOnce']: 2 nodes mount the claim"),
    Mutation("claim-name-differs", "pytorchjob.yaml", setting((*MASTER_POD, "volumes", 1, "persistentVolumeClaim", "claimName"), "runs"), "claim", f"{p(*MASTER_POD, 'volumes', 1, 'persistentVolumeClaim', 'claimName')}: 'runs' is not the claim pvc.yaml creates"),
    Mutation("trainjob-claim-name-differs", "trainjob.yaml", setting((*NODE_POD, "volumes", 1, "persistentVolumeClaim", "claimName"), "runs"), "claim", f"{p(*NODE_POD, 'volumes', 1, 'persistentVolumeClaim', 'claimName')}: 'runs' is not the claim"),
    # kustomization.yaml
    Mutation("kustomize-missing-file", "kustomization.yaml", setting(("resources", 1), "pytorchjobs.yaml"), "kustomization", "resources[1]: pytorchjobs.yaml does not exist"),
    Mutation("kustomize-image-name", "kustomization.yaml", setting(("images", 0, "name"), "trainbox"), "kustomization", "images: no entry named 'registry.example.com/trainbox'"),
    Mutation("kustomize-digest", "kustomization.yaml", setting(("images", 0, "digest"), "sha256:abc"), "kustomization", "images[0].digest: 'sha256:abc' is not sha256:<64 hex>"),
    Mutation("kustomize-tag", "kustomization.yaml", setting(("images", 0, "newTag"), "latest"), "kustomization", "images[0].newTag: pin registry.example.com/trainbox by digest"),
]  # fmt: skip


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_rule_rejects_the_broken_copy_naming_the_culprit(mutation: Mutation) -> None:
    doc = load(mutation.name)
    mutation.change(doc)
    problems = check(mutation.rule, mutation.name, doc)
    assert any(mutation.culprit in problem for problem in problems), problems


def test_every_rule_has_a_mutation() -> None:
    covered = {
        (kind_of(m.name) if m.name != "kustomization.yaml" else "", m.rule) for m in MUTATIONS
    }
    every = {(kind, rule) for kind, named in rules.RULES.items() for rule in named}
    assert every - covered == set()


# --- the machinery -------------------------------------------------------------------------------

GARBAGE = [{}, {"spec": None}, {"spec": {"pytorchReplicaSpecs": {"Master": None}}}, {"spec": {"trainer": [], "runtimePatches": [None, {"trainingRuntimeSpec": 3}]}}, {"metadata": "x", "spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [None, 3, {"name": "pytorch", "volumeMounts": [None], "args": [7]}], "volumes": "x"}}}}}}, {"images": [None, "x"], "resources": [3]}]  # fmt: skip
CHECKS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    f"{kind}-{name}": (lambda doc, rule=rule, kind=kind: rule({**doc, "kind": kind}))
    for kind, named in rules.RULES.items()
    for name, rule in named.items()
}
CHECKS["PyTorchJob-claim"] = lambda doc: rules.claim_problems({**doc, "kind": "PyTorchJob"}, doc)
CHECKS["TrainJob-claim"] = lambda doc: rules.claim_problems({**doc, "kind": "TrainJob"}, doc)
CHECKS["kustomization"] = lambda doc: rules.kustomization_problems(doc, K8S, [doc])


@pytest.mark.parametrize("name", CHECKS)
@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
def test_check_reports_malformed_input_instead_of_raising(
    name: str, garbage: dict[str, Any]
) -> None:
    assert isinstance(CHECKS[name](garbage), list)


OBJECT = {"type": "object", "properties": {"a": {"type": "string"}}}
STRICTIFY = [
    ("object-with-properties", OBJECT, {**OBJECT, "additionalProperties": False}),
    ("map-kept-open", {"type": "object", "additionalProperties": {"type": "string"}}, {"type": "object", "additionalProperties": {"type": "string"}}),
    ("preserve-unknown-fields", {**OBJECT, "x-kubernetes-preserve-unknown-fields": True}, OBJECT),
    ("nested-in-items", {"type": "array", "items": OBJECT}, {"type": "array", "items": {**OBJECT, "additionalProperties": False}}),
    ("cel-dropped", {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}, {"type": "string"}),
    ("nullable", {"type": "string", "nullable": True}, {"type": ["string", "null"]}),
    ("defaults-untouched", {"type": "object", "default": {"properties": {}}}, {"type": "object", "default": {"properties": {}}}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "strict"), [c[1:] for c in STRICTIFY], ids=[c[0] for c in STRICTIFY]
)
def test_strictify(schema: dict[str, Any], strict: dict[str, Any]) -> None:
    assert rules.strictify(schema) == strict


QUANTITIES = [("64Gi", Decimal(64 * 2**30)), ("512Mi", Decimal(512 * 2**20)), ("500m", Decimal("0.5")), (8, Decimal(8)), ("2k", Decimal(2000)), ("1e3", Decimal(1000)), ("eight", None), ("8 Gi", None), (True, None)]  # fmt: skip


@pytest.mark.parametrize(("text", "value"), QUANTITIES, ids=[str(q[0]) for q in QUANTITIES])
def test_quantity(text: Any, value: Decimal | None) -> None:
    assert rules.quantity(text) == value
