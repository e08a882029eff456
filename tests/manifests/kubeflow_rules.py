"""Offline checks for k8s/: strict CRD schemas, the operators' webhook rules, house rules.

Every check takes parsed YAML and returns problems, each starting with the path at fault; none raises.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import referencing
import yaml

K8S_DIR = Path(__file__).parents[2] / "k8s"
SCHEMAS = K8S_DIR / "schemas"

# The CRDs are vendored verbatim from kubeflow/trainer (k8s/schemas/README.md says from where).
CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): SCHEMAS / "pytorchjobs-crd-v1.9.4.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): SCHEMAS / "trainjobs-crd-v2.3.0.yaml",
}

# Pod templates are also checked against this Kubernetes release's own schema (kubernetes-validate
# ships 1.25 to 1.37): the oldest the Kubeflow Trainer Helm chart supports, so nothing newer slips in.
K8S_VERSION = "1.29"

IMAGE_USER = 1000  # the Dockerfile's `useradd --uid 1000 trainbox`
# tini stays PID 1 (a Kubernetes `command:` replaces the image's ENTRYPOINT, which holds it):
# it forwards SIGTERM to trainbox and reaps zombies; trainbox then detects the operator's env.
TRAINING_COMMAND = ["tini", "--", "trainbox", "run"]
GPU = "nvidia.com/gpu"
# Runtimes whose contract (PET_* variables, a `node` container) trainbox is written for.
TORCH_RUNTIMES = frozenset({"torch-distributed"})

Path_ = tuple[str | int, ...]
Doc = Mapping[str, Any]


# --- paths and plumbing ------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def dotted(path: Sequence[str | int]) -> str:
    """`spec.containers[0].resources.limits["nvidia.com/gpu"]`: list indices and odd keys bracketed."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out or "(document)"


def at(path: Sequence[str | int], message: str) -> str:
    """One problem: the path, then what is wrong there."""
    return f"{dotted(path)}: {message}"


def get(node: Any, *path: str | int) -> Any:
    """The value at `path`, or None where the path is missing or crosses a non-container."""
    for part in path:
        if isinstance(part, int) and isinstance(node, list) and -len(node) <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and isinstance(node, Mapping):
            node = node.get(part)
        else:
            return None
    return node


def mapping(node: Any) -> Mapping[str, Any]:
    """`node` if it is a mapping, else an empty one, so that checks walk malformed input safely."""
    return node if isinstance(node, Mapping) else {}


def items(node: Any) -> list[Any]:
    """`node` if it is a list, else an empty one."""
    return node if isinstance(node, list) else []


def load_yaml(path: Path) -> Any:
    """Parse one YAML document with libyaml when present (the CRDs are ~600 KB each)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader)


# --- Kubernetes quantities ---------------------------------------------------------------------

_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?")
_BINARY = {f"{p}i": Decimal(1024) ** (n + 1) for n, p in enumerate("KMGTPE")}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)}
_DECIMAL |= {p: Decimal(1000) ** (n + 1) for n, p in enumerate("kMGTPE")}


def quantity(value: Any) -> Decimal | None:
    """A resource quantity (`64Gi`, `8`, `500m`, `1e3`) as a number, or None if it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    match = _QUANTITY.fullmatch(str(value))
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * (_BINARY.get(suffix) or _DECIMAL[suffix])
    except (InvalidOperation, KeyError):
        return None


# --- (a) the CRD schema, made strict -----------------------------------------------------------

# Schema keywords whose values are schemas (the rest hold data, e.g. `default` or `enum`).
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SCHEMA_ONE = ("additionalProperties", "items", "not")


def strictify(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Copy an OpenAPI v3 schema so that unknown keys fail, as strict field validation does."""
    # additionalProperties: false goes on every object that lists `properties` and neither allows
    # more (`additionalProperties`) nor keeps unknown fields (`x-kubernetes-preserve-unknown-fields`).
    # Other x-kubernetes-* keys are dropped: CEL rules and list-map key uniqueness go unchecked.
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key in _SCHEMA_MAPS:
            out[key] = {name: strictify(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS:
            out[key] = [strictify(sub) for sub in value]
        elif key in _SCHEMA_ONE and isinstance(value, Mapping):
            out[key] = strictify(value)
        else:
            out[key] = value
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if schema.get("x-kubernetes-int-or-string") and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def crd_schema(crd: Mapping[str, Any], api_version: str) -> Mapping[str, Any] | None:
    """The `openAPIV3Schema` the CRD serves for `group/version`, or None if it serves none."""
    group, _, version = api_version.rpartition("/")
    if get(crd, "spec", "group") != group:
        return None
    for served in items(get(crd, "spec", "versions")):
        if get(served, "name") == version and get(served, "served") is not False:
            return get(served, "schema", "openAPIV3Schema")
    return None


@functools.cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft4Validator | None:
    crd_file = CRD_FILES.get((api_version, kind))
    if crd_file is None:
        return None
    schema = crd_schema(load_yaml(crd_file), api_version)
    # OpenAPI v3.0 schemas are Draft 4 in what these CRDs use (type, pattern, enum, min/max).
    return None if schema is None else jsonschema.Draft4Validator(strictify(schema))


def _schema_messages(
    error: jsonschema.ValidationError, relocate: Callable[[Path_], Path_] = tuple
) -> Iterator[str]:
    path = relocate(tuple(error.absolute_path))
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = set(error.schema.get("properties", {}))
        for key in sorted(set(mapping(error.instance)) - known):
            # Worded like the API server's strict field validation.
            yield at((*path, key), "unknown field")
    else:
        yield at(path, error.message)


def crd_problems(doc: Doc) -> list[str]:
    """Validate against the vendored CRD's schema made strict (no CEL, no webhook)."""
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    validator = _crd_validator(str(api_version), str(kind))
    if validator is None:
        return [at(("apiVersion",), f"no vendored CRD serves {api_version} {kind}")]
    return sorted(
        message for error in validator.iter_errors(doc) for message in _schema_messages(error)
    )


# --- (b) what only the operators' webhooks, CEL rules and Go comments say --------------------

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _dns1035(name: Any, path: Path_) -> list[str]:
    if isinstance(name, str) and _DNS1035.fullmatch(name) and len(name) <= 63:
        return []
    return [
        at(
            path,
            f"{name!r} is not a DNS-1035 label (lowercase letters, digits and '-', starting with"
            " a letter, ending with a letter or digit, at most 63 characters)",
        )
    ]


def _not_supported(path: Path_, value: Any, supported: Sequence[str]) -> str:
    choices = ", ".join(f'"{choice}"' for choice in supported)
    return at(path, f'Unsupported value: "{value}": supported values: {choices}')


PYTORCH_REPLICA_TYPES = ("Master", "Worker")
PYTORCH_CONTAINER = "pytorch"
PYTORCH_MANAGED_BY = ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue")


def pytorchjob_webhook_problems(doc: Doc) -> list[str]:
    """training-operator v1.9 `pytorchjob_webhook.go` and `ValidateRunPolicy`, re-implemented."""
    problems = _dns1035(get(doc, "metadata", "name"), ("metadata", "name"))
    spec = mapping(doc.get("spec"))
    managed_by = get(spec, "runPolicy", "managedBy")
    if managed_by is not None and managed_by not in PYTORCH_MANAGED_BY:
        problems.append(
            _not_supported(("spec", "runPolicy", "managedBy"), managed_by, PYTORCH_MANAGED_BY)
        )
    replica_specs = spec.get("pytorchReplicaSpecs")
    if "elasticPolicy" in spec:
        if "Worker" not in mapping(replica_specs):
            problems.append(
                at(
                    ("spec", "pytorchReplicaSpecs", "Worker"),
                    "Required value: must be configured if elastic policy is used",
                )
            )
        if get(spec, "elasticPolicy", "nProcPerNode") is not None and "nprocPerNode" in spec:
            problems.append(
                at(
                    ("spec", "elasticPolicy", "nProcPerNode"),
                    "Forbidden: must not be used with spec.nprocPerNode",
                )
            )
    if not isinstance(replica_specs, Mapping):
        return [*problems, at(("spec", "pytorchReplicaSpecs"), "Required value: must be required")]
    for rtype, rspec in replica_specs.items():
        role: Path_ = ("spec", "pytorchReplicaSpecs", rtype)
        if rtype not in PYTORCH_REPLICA_TYPES:
            problems.append(_not_supported(role, rtype, PYTORCH_REPLICA_TYPES))
        containers = items(get(rspec, "template", "spec", "containers"))
        containers_path = (*role, "template", "spec", "containers")
        if not containers:
            problems.append(at(containers_path, "Required value: must be specified"))
        for index, container in enumerate(containers):
            if not get(container, "image"):
                problems.append(at((*containers_path, index, "image"), "Required value"))
        if not any(get(c, "name") == PYTORCH_CONTAINER for c in containers):
            problems.append(
                at(
                    containers_path,
                    f"Required value: must have at least one container with name {PYTORCH_CONTAINER}",
                )
            )
        replicas = get(rspec, "replicas")
        if rtype == "Master" and replicas != 1:
            # The webhook rejects a missing value too, although the defaulter would set 1.
            got = "unset" if replicas is None else replicas
            problems.append(at((*role, "replicas"), f"Forbidden: must be 1, not {got}"))
        elif isinstance(replicas, int) and replicas < 1:
            problems.append(at((*role, "replicas"), "Forbidden: must be at least 1"))
    return problems


RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("All", "Running", "None")
_NPROC_PER_NODE = re.compile(r"auto|cpu|gpu|[1-9][0-9]*")


def pytorchjob_enum_problems(doc: Doc) -> list[str]:
    """The enums the v1 CRD only states in prose: restartPolicy, cleanPodPolicy, nprocPerNode."""
    problems = []
    spec = mapping(doc.get("spec"))
    for rtype, rspec in mapping(spec.get("pytorchReplicaSpecs")).items():
        policy = get(rspec, "restartPolicy")
        if policy is not None and policy not in RESTART_POLICIES:
            path = ("spec", "pytorchReplicaSpecs", rtype, "restartPolicy")
            problems.append(_not_supported(path, policy, RESTART_POLICIES))
    clean = get(spec, "runPolicy", "cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        path = ("spec", "runPolicy", "cleanPodPolicy")
        problems.append(_not_supported(path, clean, CLEAN_POD_POLICIES))
    nproc = spec.get("nprocPerNode")
    if nproc is not None and not _NPROC_PER_NODE.fullmatch(str(nproc)):
        problems.append(
            at(("spec", "nprocPerNode"), f"{nproc!r} is not auto, cpu, gpu or a positive integer")
        )
    return problems


# TorchRunReservedEnvNames in kubeflow/trainer pkg/constants: the torch runtime sets these.
TORCHRUN_RESERVED_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
# runtimePatches may not set env on these containers (examples/yaml/02-runtime-patches.yaml).
PATCH_ENV_FORBIDDEN = ("node", "dataset-initializer", "model-initializer")
TRAINJOB_MANAGED_BY = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")


def patched_pods(spec: Mapping[str, Any]) -> Iterator[tuple[str, Path_, Mapping[str, Any]]]:
    """Each runtime patch's pod spec: the replicated job's name, the path, the pod spec."""
    for p_index, patch in enumerate(items(spec.get("runtimePatches"))):
        jobs = items(get(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs"))
        for j_index, job in enumerate(jobs):
            pod = get(job, "template", "spec", "template", "spec")
            if isinstance(pod, Mapping):
                path = (
                    "spec", "runtimePatches", p_index, "trainingRuntimeSpec", "template", "spec",
                    "replicatedJobs", j_index, "template", "spec", "template", "spec",
                )  # fmt: skip
                yield str(get(job, "name")), path, pod


def trainjob_webhook_problems(doc: Doc) -> list[str]:
    """Trainer v2.3's TrainJob webhook, torch plugin and CEL rules that matter on create."""
    problems = _dns1035(get(doc, "metadata", "name"), ("metadata", "name"))
    spec = mapping(doc.get("spec"))
    managed_by = spec.get("managedBy")
    if managed_by is not None and managed_by not in TRAINJOB_MANAGED_BY:
        problems.append(_not_supported(("spec", "managedBy"), managed_by, TRAINJOB_MANAGED_BY))
    ref = mapping(spec.get("runtimeRef"))
    name = ref.get("name")
    if not (isinstance(name, str) and _DNS1123_SUBDOMAIN.fullmatch(name)):
        problems.append(at(("spec", "runtimeRef", "name"), f"{name!r} cannot name a runtime"))
    if ref.get("apiGroup", "trainer.kubeflow.org") != "trainer.kubeflow.org":
        problems.append(at(("spec", "runtimeRef", "apiGroup"), "unsupported runtime"))
    if ref.get("kind", "ClusterTrainingRuntime") not in RUNTIME_KINDS:
        problems.append(_not_supported(("spec", "runtimeRef", "kind"), ref["kind"], RUNTIME_KINDS))
    for index, env in enumerate(items(get(spec, "trainer", "env"))):
        if get(env, "name") in TORCHRUN_RESERVED_ENV:
            path = ("spec", "trainer", "env", index, "name")
            problems.append(at(path, f"{env['name']} is reserved: the torch runtime sets it"))
    for _, pod_path, pod in patched_pods(spec):
        for field in ("containers", "initContainers"):
            for index, container in enumerate(items(pod.get(field))):
                if get(container, "name") in PATCH_ENV_FORBIDDEN and "env" in container:
                    problems.append(
                        at(
                            (*pod_path, field, index, "env"),
                            f"Forbidden: set {container['name']}'s env in spec.trainer.env",
                        )
                    )
    return problems


# --- (c) house rules ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingPod:
    """A pod a job creates, seen through the training container, with where each part is written."""

    spec: Mapping[str, Any]  # pod-level fields: securityContext, volumes, ...
    spec_path: Path_
    container: Mapping[str, Any]  # image, command, args, resources, securityContext, volumeMounts
    container_paths: Mapping[str, Path_]  # field -> where the manifest writes it

    def where(self, field: str, *rest: str | int) -> Path_:
        """Path of a container field (or a part of it) in the manifest."""
        return (*self.container_paths[field], *rest)


_CONTAINER_FIELDS = (
    "image",
    "command",
    "args",
    "env",
    "envFrom",
    "resources",
    "securityContext",
    "volumeMounts",
)


def pytorchjob_pods(doc: Doc) -> dict[str, TrainingPod]:
    """Each replica type's pod, seen through its `pytorch` container."""
    pods = {}
    for rtype, rspec in mapping(get(doc, "spec", "pytorchReplicaSpecs")).items():
        spec_path: Path_ = ("spec", "pytorchReplicaSpecs", rtype, "template", "spec")
        pod = mapping(get(rspec, "template", "spec"))
        containers = items(pod.get("containers"))
        index = next(
            (i for i, c in enumerate(containers) if get(c, "name") == PYTORCH_CONTAINER), None
        )
        container_path: Path_ = (*spec_path, "containers", 0 if index is None else index)
        pods[rtype] = TrainingPod(
            spec=pod,
            spec_path=spec_path,
            container={} if index is None else mapping(containers[index]),
            container_paths={field: (*container_path, field) for field in _CONTAINER_FIELDS},
        )
    return pods


def trainjob_pod(doc: Doc) -> TrainingPod:
    """The `node` pod: spec.trainer's fields plus this job's runtime patch for `node`."""
    spec = mapping(doc.get("spec"))
    node = next(((path, pod) for name, path, pod in patched_pods(spec) if name == "node"), None)
    spec_path, pod = node or (("spec", "runtimePatches"), {})
    patched: Mapping[str, Any] = {}
    patched_path: Path_ = spec_path
    for index, container in enumerate(items(pod.get("containers"))):
        if get(container, "name") == "node":
            patched, patched_path = mapping(container), (*spec_path, "containers", index)
    trainer = mapping(spec.get("trainer"))
    fields = {
        "image": ("image", trainer),
        "command": ("command", trainer),
        "args": ("args", trainer),
        "env": ("env", trainer),
        "envFrom": ("envFrom", trainer),  # no such field: the CRD rejects it
        "resources": ("resourcesPerNode", trainer),
        "securityContext": ("securityContext", patched),
        "volumeMounts": ("volumeMounts", patched),
    }
    container = {field: source[key] for field, (key, source) in fields.items() if key in source}
    paths = {
        field: (*(("spec", "trainer") if source is trainer else patched_path), key)
        for field, (key, source) in fields.items()
    }
    return TrainingPod(spec=pod, spec_path=spec_path, container=container, container_paths=paths)


_DIGEST = re.compile(r"[^\s@]+@sha256:[0-9a-f]{64}")


def image_problems(pod: TrainingPod) -> list[str]:
    """The image is pinned by digest: a tag can move, and every node must run the same bytes."""
    image = pod.container.get("image")
    if isinstance(image, str) and _DIGEST.fullmatch(image):
        return []
    return [at(pod.where("image"), f"{image!r} is not pinned by digest (NAME@sha256:<64 hex>)")]


def command_problems(pod: TrainingPod) -> list[str]:
    """The container runs `trainbox run`, which detects the operator's variables itself."""
    command = pod.container.get("command")
    if command == TRAINING_COMMAND:
        return []
    return [at(pod.where("command"), f"{command!r} is not {TRAINING_COMMAND!r}")]


def _mounted(pod: TrainingPod, mount_path: str) -> tuple[Path_, Mapping[str, Any]] | None:
    """Path of the volume mounted at `mount_path` in the training container, and the volume."""
    for mount in items(pod.container.get("volumeMounts")):
        if get(mount, "mountPath") == mount_path:
            for index, volume in enumerate(items(pod.spec.get("volumes"))):
                if get(volume, "name") == get(mount, "name"):
                    return (*pod.spec_path, "volumes", index), mapping(volume)
    return None


def shm_problems(pod: TrainingPod) -> list[str]:
    """/dev/shm is a sized memory emptyDir, and the memory limit holds it with room to spare."""
    mounted = _mounted(pod, "/dev/shm")
    if mounted is None:
        return [
            at(
                pod.where("volumeMounts"),
                "no volume mounted at /dev/shm (an emptyDir with medium: Memory and a sizeLimit;"
                " the default is 64 MiB)",
            )
        ]
    path, volume = mounted
    if get(volume, "emptyDir", "medium") != "Memory":
        return [
            at(
                (*path, "emptyDir", "medium"),
                "the /dev/shm volume must be an emptyDir with medium: Memory",
            )
        ]
    size = get(volume, "emptyDir", "sizeLimit")
    if quantity(size) is None:
        return [
            at(
                (*path, "emptyDir", "sizeLimit"),
                "set a size, so that the memory limit can be sized for it",
            )
        ]
    memory = get(pod.container, "resources", "limits", "memory")
    memory_path = pod.where("resources", "limits", "memory")
    if quantity(memory) is None:
        return [at(memory_path, "set a memory limit: tmpfs pages in /dev/shm are charged to it")]
    if quantity(memory) <= quantity(size):
        return [
            at(
                memory_path,
                f"{memory} does not exceed the /dev/shm sizeLimit {size}: tmpfs pages count"
                " against the pod's memory limit",
            )
        ]
    return []


def run_dir_problems(pod: TrainingPod) -> list[str]:
    """`run_dir=` points into a mounted PVC, or into a bucket (`s3://`), so that checkpoints
    outlive the pod."""
    run_dirs = [arg for arg in items(pod.container.get("args")) if str(arg).startswith("run_dir=")]
    if run_dirs and str(run_dirs[-1]).startswith(f"run_dir={OBJECT_STORE_SCHEME}"):
        return object_store_problems(pod, str(run_dirs[-1]).removeprefix("run_dir="))
    claims = []
    for mount in items(pod.container.get("volumeMounts")):
        mounted = _mounted(pod, str(get(mount, "mountPath")))
        if mounted is not None and "persistentVolumeClaim" in mounted[1]:
            claims.append(str(get(mount, "mountPath")).rstrip("/"))
    if not claims:
        return [at(pod.where("volumeMounts"), "no persistentVolumeClaim is mounted for run_dir")]
    if not run_dirs:
        return [at(pod.where("args"), "no run_dir=... override; it must point into the PVC")]
    run_dir = str(run_dirs[-1]).removeprefix("run_dir=")
    if not any(run_dir.startswith(f"{claim}/") for claim in claims):
        return [at(pod.where("args"), f"run_dir={run_dir} is not under a PVC mount {claims}")]
    return []


# What run_dir may name instead of a PVC path: a bucket and prefix in S3-compatible storage.
OBJECT_STORE_SCHEME = "s3://"
_OBJECT_STORE_URL = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?")
# Where each node keeps its working copy of a bucket's run_dir ($TMPDIR, unset in the image).
WORKING_COPY = "/tmp"
# The Secret k8s/*-s3.yaml take the store's credentials from (their `kubectl create secret`).
S3_SECRET = "trainbox-s3"
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def object_store_problems(pod: TrainingPod, run_dir: str) -> list[str]:
    """A bucket's run_dir: a well-formed URL, credentials from the Secret, and a sized disk
    emptyDir at /tmp for the node's working copy."""
    problems = []
    if not _OBJECT_STORE_URL.fullmatch(run_dir):
        problems.append(at(pod.where("args"), f"run_dir={run_dir} is not s3://BUCKET/PREFIX"))
    problems += _credentials_problems(pod)
    mounted = _mounted(pod, WORKING_COPY)
    if mounted is None:
        return [
            *problems,
            at(
                pod.where("volumeMounts"),
                f"no volume mounted at {WORKING_COPY}: each node's working copy of run_dir goes"
                " there (an emptyDir with a sizeLimit)",
            ),
        ]
    path, volume = mounted
    empty_dir = get(volume, "emptyDir")
    if not isinstance(empty_dir, Mapping) or empty_dir.get("medium") == "Memory":
        problems.append(
            at(
                (*path, "emptyDir"),
                f"the {WORKING_COPY} volume must be an emptyDir on disk: the working copy holds"
                " checkpoints, and in memory they would count against the memory limit",
            )
        )
    elif quantity(empty_dir.get("sizeLimit")) is None:
        problems.append(
            at(
                (*path, "emptyDir", "sizeLimit"),
                "set a size: room for the newest checkpoint twice",
            )
        )
    return problems


def _credentials_problems(pod: TrainingPod) -> list[str]:
    """The store's keys come from the Secret (envFrom, or one secretKeyRef per key), required;
    or from a ServiceAccount (IRSA), with no Secret at all."""
    if pod.spec.get("serviceAccountName"):
        return []
    problems = []
    whole = [
        (index, ref)
        for index, source in enumerate(items(pod.container.get("envFrom")))
        if isinstance(ref := get(source, "secretRef"), Mapping) and ref.get("name") == S3_SECRET
    ]
    for index, ref in whole:
        if ref.get("optional") is True:
            path = pod.where("envFrom", index, "secretRef", "optional")
            problems.append(at(path, "must not be true: a pod without the keys cannot train"))
    by_key = {
        str(get(item, "name")): (index, mapping(get(item, "valueFrom", "secretKeyRef")))
        for index, item in enumerate(items(pod.container.get("env")))
        if get(item, "valueFrom", "secretKeyRef") is not None
    }
    for key in S3_KEYS if not whole else ():
        index, ref = by_key.get(key, (None, {}))
        if index is None or ref.get("name") != S3_SECRET or ref.get("key") != key:
            problems.append(
                at(
                    pod.where("env"),
                    f"{key} does not come from the Secret {S3_SECRET!r} (envFrom: secretRef, or"
                    " valueFrom: secretKeyRef), and no serviceAccountName is set (IRSA)",
                )
            )
        elif ref.get("optional") is True:
            path = pod.where("env", index, "valueFrom", "secretKeyRef", "optional")
            problems.append(at(path, "must not be true: a pod without the keys cannot train"))
    return problems


def security_problems(pod: TrainingPod) -> list[str]:
    """Non-root as the image's user, no privilege escalation, no capabilities, default seccomp."""
    pod_context = mapping(pod.spec.get("securityContext"))
    container_context = mapping(pod.container.get("securityContext"))
    pod_path = (*pod.spec_path, "securityContext")

    def effective(field: str) -> Any:
        # The container's setting wins over the pod's, as in Kubernetes.
        return container_context.get(field, pod_context.get(field))

    problems = []
    if effective("runAsNonRoot") is not True:
        problems.append(at((*pod_path, "runAsNonRoot"), "must be true (here or in the container)"))
    if effective("runAsUser") != IMAGE_USER:
        problems.append(
            at((*pod_path, "runAsUser"), f"must be {IMAGE_USER}, the image's non-root user")
        )
    if get(effective("seccompProfile"), "type") != "RuntimeDefault":
        problems.append(at((*pod_path, "seccompProfile", "type"), "must be RuntimeDefault"))
    if container_context.get("allowPrivilegeEscalation") is not False:
        path = pod.where("securityContext", "allowPrivilegeEscalation")
        problems.append(at(path, "must be false"))
    if "ALL" not in items(get(container_context, "capabilities", "drop")):
        problems.append(at(pod.where("securityContext", "capabilities", "drop"), "must drop ALL"))
    return problems


def _gpu_problems(pod: TrainingPod, procs: int | None, procs_name: str) -> list[str]:
    limit = get(pod.container, "resources", "limits", GPU)
    path = pod.where("resources", "limits", GPU)
    if limit is None:
        return [at(path, f"missing; it must equal {procs_name} (one worker per GPU)")]
    problems = []
    if procs is not None and quantity(limit) != procs:
        problems.append(at(path, f"{limit!r} GPUs, but {procs_name} is {procs}; keep them equal"))
    request = get(pod.container, "resources", "requests", GPU)
    if request is not None and quantity(request) != quantity(limit):
        path = pod.where("resources", "requests", GPU)
        problems.append(at(path, f"{request} differs from the limit {limit}"))
    return problems


def _int(value: Any) -> int | None:
    text = str(value)
    return int(text) if text.isdigit() and not isinstance(value, bool) else None


def pytorchjob_house_problems(doc: Doc) -> list[str]:
    """Our own rules for k8s/pytorchjob.yaml on top of what the operator accepts."""
    spec = mapping(doc.get("spec"))
    pods = pytorchjob_pods(doc)
    problems = []
    procs = _int(spec.get("nprocPerNode"))
    if procs is None:
        problems.append(
            at(
                ("spec", "nprocPerNode"),
                f"{spec.get('nprocPerNode')!r}: set the GPU count, so that WORLD_SIZE counts"
                " every worker and the GPU limits can be checked against it",
            )
        )
    for rtype, pod in pods.items():
        problems += image_problems(pod) + command_problems(pod) + shm_problems(pod)
        problems += run_dir_problems(pod) + security_problems(pod)
        problems += _gpu_problems(pod, procs, "spec.nprocPerNode")
        policy = get(spec, "pytorchReplicaSpecs", rtype, "restartPolicy")
        if policy != "ExitCode":
            problems.append(
                at(
                    ("spec", "pytorchReplicaSpecs", rtype, "restartPolicy"),
                    f"{policy!r}: use ExitCode, so that 143 (preempted) is retried and 2/3/4 are not",
                )
            )
    limits = {rtype: get(pod.container, "resources", "limits", GPU) for rtype, pod in pods.items()}
    if len({quantity(limit) for limit in limits.values()}) > 1:
        problems.append(at(("spec", "pytorchReplicaSpecs"), f"GPU limits differ: {limits}"))
    problems += elastic_problems(spec)
    # An elastic job may be Workers only: they are then the one template to keep alike.
    master = get(spec, "pytorchReplicaSpecs", "Master", "template")
    for rtype in pods.keys() - {"Master"} if master is not None else ():
        template = get(spec, "pytorchReplicaSpecs", rtype, "template")
        where = first_difference(
            master, template, ("spec", "pytorchReplicaSpecs", rtype, "template")
        )
        if where is not None:
            problems.append(
                at(where, "differs from the Master's template; every node runs the same pod")
            )
    return problems


def elastic_problems(spec: Mapping[str, Any]) -> list[str]:
    """An elasticPolicy that can survive a lost node: restarts to re-form with, and a Worker
    count inside the node range (the operator exports MIN:MAX as PET_NNODES)."""
    policy = spec.get("elasticPolicy")
    if policy is None:
        return []
    where: Path_ = ("spec", "elasticPolicy")
    problems = []
    restarts = _int(get(policy, "maxRestarts"))
    if not restarts:
        problems.append(
            at(
                (*where, "maxRestarts"),
                f"{get(policy, 'maxRestarts')!r}: set at least 1, else the first lost node ends"
                " the job instead of re-forming it",
            )
        )
    low, high = _int(get(policy, "minReplicas")), _int(get(policy, "maxReplicas"))
    replicas = _int(get(spec, "pytorchReplicaSpecs", "Worker", "replicas") or 1)
    if low is None or high is None or replicas is None or not 1 <= low <= replicas <= high:
        problems.append(
            at(
                where,
                f"minReplicas {low}, Worker replicas {replicas}, maxReplicas {high}: set all"
                " three with 1 <= minReplicas <= replicas <= maxReplicas",
            )
        )
    return problems


def first_difference(left: Any, right: Any, path: Path_ = ()) -> Path_ | None:
    """Where `right` first differs from `left`, or None if they are equal."""
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        for key in sorted(left.keys() | right.keys()):
            found = first_difference(left.get(key), right.get(key), (*path, key))
            if found is not None:
                return found
        return None
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            found = first_difference(a, b, (*path, index))
            if found is not None:
                return found
        return None
    return None if left == right else path


def trainjob_house_problems(doc: Doc) -> list[str]:
    """Our own rules for k8s/trainjob.yaml on top of what Trainer accepts."""
    pod = trainjob_pod(doc)
    problems = image_problems(pod) + command_problems(pod) + shm_problems(pod)
    problems += run_dir_problems(pod) + security_problems(pod)
    procs = get(doc, "spec", "trainer", "numProcPerNode")
    if _int(procs) is None:
        problems.append(
            at(("spec", "trainer", "numProcPerNode"), f"{procs!r}: set the GPU count per node")
        )
    problems += _gpu_problems(pod, _int(procs), "spec.trainer.numProcPerNode")
    name = get(doc, "spec", "runtimeRef", "name")
    if name not in TORCH_RUNTIMES:
        problems.append(
            at(
                ("spec", "runtimeRef", "name"),
                f"{name!r} is not a runtime trainbox is written for ({sorted(TORCH_RUNTIMES)})",
            )
        )
    return problems


def claim_problems(job: Doc, pvc: Doc) -> list[str]:
    """The job mounts the claim pvc.yaml creates, and a multi-node job can share it."""
    pods = (
        list(pytorchjob_pods(job).values())
        if job.get("kind") == "PyTorchJob"
        else [trainjob_pod(job)]
    )
    name = get(pvc, "metadata", "name")
    problems = []
    mounts_a_claim = False
    for pod in pods:
        for index, volume in enumerate(items(pod.spec.get("volumes"))):
            claim = get(volume, "persistentVolumeClaim", "claimName")
            mounts_a_claim |= claim is not None
            if claim is not None and claim != name:
                path = (*pod.spec_path, "volumes", index, "persistentVolumeClaim", "claimName")
                problems.append(at(path, f"{claim!r} is not the claim pvc.yaml creates ({name!r})"))
    if not mounts_a_claim:
        return problems  # run_dir is elsewhere (a bucket): the claim's access modes do not matter
    if job.get("kind") == "PyTorchJob":
        specs = mapping(get(job, "spec", "pytorchReplicaSpecs")).values()
        nodes = sum(_int(get(spec, "replicas") or 1) or 0 for spec in specs)
    else:
        nodes = _int(get(job, "spec", "trainer", "numNodes") or 1) or 0
    modes = items(get(pvc, "spec", "accessModes"))
    if nodes > 1 and "ReadWriteMany" not in modes:
        problems.append(
            at(
                ("spec", "accessModes"),
                f"{modes}: {nodes} nodes mount the claim, so it needs ReadWriteMany",
            )
        )
    return problems


# --- (d) Kubernetes' own schema ----------------------------------------------------------------


@functools.cache
def _k8s_validator(schema_file: str) -> jsonschema.Draft202012Validator:
    """A validator for one of kubernetes-validate's strict schemas at K8S_VERSION."""
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    folder = root / f"v{K8S_VERSION}.0-local-strict"
    schema = json.loads((folder / schema_file).read_text())
    definitions = json.loads((folder / "_definitions.json").read_text())
    registry = referencing.Registry().with_resources(
        (document["$id"], referencing.Resource.from_contents(document))
        for document in (schema, definitions)
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


def k8s_schema_problems_for(
    value: Any, schema_file: str, relocate: Callable[[Path_], Path_] = tuple
) -> list[str]:
    """Validate `value` against a strict Kubernetes schema; `relocate` maps paths to the manifest."""
    validator = _k8s_validator(schema_file)
    return sorted(
        message
        for error in validator.iter_errors(value)
        for message in _schema_messages(error, relocate)
    )


def _under(prefix: Path_) -> Callable[[Path_], Path_]:
    return lambda path: (*prefix, *path)


def _in_trainjob(pod: TrainingPod) -> Callable[[Path_], Path_]:
    """Map a path in the assembled `node` pod template back to the TrainJob's fields."""

    def relocate(path: Path_) -> Path_:
        if path[:3] == ("spec", "containers", 0) and len(path) > 3:
            field = str(path[3])
            if field in pod.container_paths:
                return pod.where(field, *path[4:])
        return (*pod.spec_path, *path[1:]) if path[:1] == ("spec",) else path

    return relocate


def k8s_schema_problems(doc: Doc) -> list[str]:
    """Pod templates, metadata and core objects against Kubernetes' own schema, strictly."""
    kind = doc.get("kind")
    if doc.get("apiVersion") == "v1" and kind == "PersistentVolumeClaim":
        return k8s_schema_problems_for(doc, "persistentvolumeclaim-v1.json")
    # A custom resource's metadata is ObjectMeta, which the CRD schemas leave open.
    metadata = doc.get("metadata")
    problems = k8s_schema_problems_for(metadata, "objectmeta-meta-v1.json", _under(("metadata",)))
    if kind == "PyTorchJob":
        for rtype, rspec in mapping(get(doc, "spec", "pytorchReplicaSpecs")).items():
            prefix = ("spec", "pytorchReplicaSpecs", rtype, "template")
            template = get(rspec, "template")
            problems += k8s_schema_problems_for(template, "podtemplatespec-v1.json", _under(prefix))
    elif kind == "TrainJob":
        # The runtime builds the pod on the cluster; check what this job contributes to the
        # `node` pod, assembled into a pod template, and report each field where it is written.
        pod = trainjob_pod(doc)
        template = {"spec": {**pod.spec, "containers": [{"name": "node", **pod.container}]}}
        problems += k8s_schema_problems_for(template, "podtemplatespec-v1.json", _in_trainjob(pod))
    return problems


# --- kustomize ---------------------------------------------------------------------------------


def _image_name(image: str) -> str:
    """`registry:5000/team/trainbox` from `registry:5000/team/trainbox:tag@sha256:...`."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def job_images(job: Doc) -> list[str]:
    """Every image a job names."""
    if job.get("kind") == "TrainJob":
        return [str(get(job, "spec", "trainer", "image"))]
    return [str(pod.container.get("image")) for pod in pytorchjob_pods(job).values()]


def kustomization_problems(kustomization: Doc, root: Path, jobs: Sequence[Doc]) -> list[str]:
    """Files the kustomization lists exist, and its `images:` entry matches the manifests' image."""
    problems = []
    for field in ("resources", "configurations"):
        for index, entry in enumerate(items(kustomization.get(field))):
            if not (root / str(entry)).exists():
                problems.append(at((field, index), f"{entry} does not exist in {root}"))
    entries = {
        get(entry, "name"): (index, mapping(entry))
        for index, entry in enumerate(items(kustomization.get("images")))
    }
    used = {_image_name(image): str(get(job, "kind")) for job in jobs for image in job_images(job)}
    for name, kind in used.items():
        if name not in entries:
            problems.append(at(("images",), f"no entry named {name!r}, the image {kind} uses"))
    for name, (index, entry) in entries.items():
        digest = get(entry, "digest")
        if not (isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)):
            problems.append(at(("images", index, "digest"), f"{digest!r} is not sha256:<64 hex>"))
        if "newTag" in entry:
            problems.append(at(("images", index, "newTag"), f"pin {name} by digest, not by tag"))
    return problems


# --- everything at once ------------------------------------------------------------------------

Rule = Callable[[Doc], list[str]]

RULES: dict[str, dict[str, Rule]] = {
    "PyTorchJob": {
        "crd": crd_problems,
        "webhook": pytorchjob_webhook_problems,
        "enums": pytorchjob_enum_problems,
        "house": pytorchjob_house_problems,
        "k8s_schema": k8s_schema_problems,
    },
    "TrainJob": {
        "crd": crd_problems,
        "webhook": trainjob_webhook_problems,
        "house": trainjob_house_problems,
        "k8s_schema": k8s_schema_problems,
    },
    "PersistentVolumeClaim": {"k8s_schema": k8s_schema_problems},
}


def all_problems(doc: Doc) -> list[str]:
    """Every rule that applies to this document's kind."""
    rules = RULES.get(str(doc.get("kind")))
    if rules is None:
        return [at(("kind",), f"no rules for {doc.get('kind')!r}")]
    return [problem for rule in rules.values() for problem in rule(doc)]
