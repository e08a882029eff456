"""The k8s/ manifests' own pods, rendered as their operators would create them and run with
`podman kube play` on a podman network with DNS.

There is no API server or operator here. Rendering stands in for the operator: each pod is the
manifest's pod template copied as it is (image, command, args, env, resources, securityContext,
volumes, terminationGracePeriodSeconds), with only what the operator itself adds:

- its environment: the facts in tests/launchers/pods.py, from the operators' source;
- the pod's name and hostname, which the master's DNS name is made of. The operator's
  per-pod (PyTorchJob) or headless (JobSet) Service is not rendered: on a podman network with
  DNS a pod's name resolves to its address, which is what that Service gives;
- `restartPolicy: Never`, what the operator makes of `ExitCode`; JobSet retries are not run.

The container port the v1 operator declares (`pytorchjob-port`) is left out: it opens nothing in
a pod, but podman 4.3 would publish it on the host, and two pods cannot both take 23456 there.

The v1 operator's `init-pytorch` container (an alpine image that waits for the master's DNS
name) is not rendered: there is no alpine image here, and trainbox waits for the master itself.

What podman 4.3 cannot honour, and what stands in for it (`for_podman`):

- an emptyDir with `medium: Memory`: podman before 5.0 makes it a disk volume and drops its
  `sizeLimit` (containers/podman#21367, #21524, #29565). Each becomes a tmpfs podman volume of
  that size, mounted through a claim of its own.
- the PersistentVolumeClaim becomes a podman named volume (kube play's own mapping). All pods
  here share one host, as the pods of a job share a ReadWriteMany volume.
- an emptyDir on disk (the -s3 manifests' /tmp): podman 4.3 names its volume after the pod's
  volume alone, so every pod of a job (and every job) with a `tmp` emptyDir would share one
  directory. Each is renamed `<pod>-<volume>`, which podman makes per pod and removes with it
  (`podman kube down`), as Kubernetes does. Its `sizeLimit` is not honoured: podman has no size
  for a disk volume here.
- a Secret (`kind: Secret`, what `kubectl create secret generic` makes): podman 4.3 stores one
  from kube YAML as YAML but reads secrets for `envFrom` and `secretKeyRef` as JSON
  (containers/podman#16269), so the Secret is not played. Its `data` (base64 values, as in
  Kubernetes) becomes a podman secret of that JSON before the pods start; the pods' `envFrom` and
  `secretKeyRef` then resolve through podman itself, unchanged.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import platform
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from container.image import ROOT, podman
from launchers import pods as operator

K8S = ROOT / "k8s"
# The ports the operators use: each pod has its own address, so no two jobs collide on them.
PYTORCHJOB_PORT = 23456
TRAINJOB_PORT = 29500

Doc = dict[str, Any]


def load(name: str) -> Doc:
    """A fresh copy of a shipped manifest."""
    return yaml.safe_load((K8S / name).read_text())


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """What a user edits in the manifests (k8s/README.md, "Knobs"), set for this machine."""

    # The job's name, which names its pods and the master's DNS name.
    name: str
    # The PersistentVolumeClaim's name.
    claim: str
    # The image under test.
    image: str
    # Pods (nodes) in the job.
    nodes: int
    # Processes per pod: nprocPerNode or numProcPerNode.
    nproc: int
    # resources.limits.cpu and .memory of every pod.
    cpu: str
    memory: str
    # The /dev/shm emptyDir's sizeLimit.
    shm: str
    # trainbox overrides after the manifest's own args (the last of a key wins).
    args: tuple[str, ...] = ()
    # Variables set in the training container's env (fault injection, AWS_ENDPOINT_URL): an
    # entry of the manifest's with the same name is replaced in place, as a user edits it.
    env: Mapping[str, str] = field(default_factory=dict)
    # The `run_dir=` argument's value, in place of the manifest's (the bucket of an -s3 manifest).
    run_dir: str | None = None
    # The Secret that envFrom and secretKeyRef name, in place of the manifest's `trainbox-s3`.
    secret: str | None = None


def _limits(resources: dict[str, Any], knobs: Knobs) -> None:
    limits = resources.setdefault("limits", {})
    limits.pop("nvidia.com/gpu", None)  # no GPU here
    limits.update(cpu=knobs.cpu, memory=knobs.memory)


def _pod_knobs(spec: dict[str, Any], knobs: Knobs) -> None:
    for volume in spec.get("volumes", []):
        if volume.get("emptyDir", {}).get("medium") == "Memory":
            volume["emptyDir"]["sizeLimit"] = knobs.shm
        if "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] = knobs.claim


def _container_knobs(container: dict[str, Any], knobs: Knobs) -> None:
    args = container.get("args", [])
    if knobs.run_dir is not None:
        args = [f"run_dir={knobs.run_dir}" if a.startswith("run_dir=") else a for a in args]
    container["args"] = [*args, *knobs.args]
    env = container.setdefault("env", [])
    for key, value in knobs.env.items():
        names = [item["name"] for item in env]
        entry = {"name": key, "value": value}
        if key in names:
            env[names.index(key)] = entry
        else:
            env.append(entry)
    if knobs.secret is not None:
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                source["secretRef"]["name"] = knobs.secret
        for item in container["env"]:
            if "secretKeyRef" in item.get("valueFrom", {}):
                item["valueFrom"]["secretKeyRef"]["name"] = knobs.secret


def set_pytorchjob_knobs(job: Doc, knobs: Knobs) -> Doc:
    """`job` with the knobs set; every other field stays as shipped."""
    job = copy.deepcopy(job)
    job["metadata"]["name"] = knobs.name
    job["spec"]["nprocPerNode"] = str(knobs.nproc)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    replicas["Worker"]["replicas"] = knobs.nodes - 1
    for replica in replicas.values():
        spec = replica["template"]["spec"]
        _pod_knobs(spec, knobs)
        for container in spec["containers"]:
            container["image"] = knobs.image
            _limits(container.setdefault("resources", {}), knobs)
            _container_knobs(container, knobs)
    return job


def set_trainjob_knobs(job: Doc, knobs: Knobs) -> Doc:
    """`job` with the knobs set; every other field stays as shipped."""
    job = copy.deepcopy(job)
    job["metadata"]["name"] = knobs.name
    trainer = job["spec"]["trainer"]
    trainer.update(image=knobs.image, numNodes=knobs.nodes, numProcPerNode=knobs.nproc)
    _limits(trainer.setdefault("resourcesPerNode", {}), knobs)
    _container_knobs(trainer, knobs)
    for patch in job["spec"].get("runtimePatches", []):
        for _, spec in _patched_pod_specs(patch):
            _pod_knobs(spec, knobs)
    return job


def set_pvc_knobs(pvc: Doc, knobs: Knobs) -> Doc:
    """The claim renamed to `knobs.claim`."""
    pvc = copy.deepcopy(pvc)
    pvc["metadata"]["name"] = knobs.claim
    return pvc


def secret(name: str, literals: Mapping[str, str]) -> Doc:
    """The Secret `kubectl create secret generic NAME --from-literal=KEY=VALUE ...` creates."""
    data = {key: base64.b64encode(value.encode()).decode() for key, value in literals.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "data": data,
    }


# The node every rendered pod runs on: this host (the downward API's spec.nodeName).
NODE_NAME = platform.node()


# --- what the operators create -------------------------------------------------------------------


def _with_env(container: dict[str, Any], injected: Mapping[str, str]) -> None:
    # The operators upsert their variables: a same-named entry of the user's is replaced.
    own = [item for item in container.get("env", []) if item["name"] not in injected]
    container["env"] = [*own, *({"name": k, "value": v} for k, v in injected.items())]
    _downward_api(container)


def _downward_api(container: dict[str, Any]) -> None:
    """What the kubelet does with `valueFrom.fieldRef: spec.nodeName`: the node's name as a value.

    podman kube play knows no nodes; every pod here runs on this one host, so its name stands in.
    """
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("fieldRef", {})
        if ref.get("fieldPath") == "spec.nodeName":
            del item["valueFrom"]
            item["value"] = NODE_NAME


def _pod(name: str, hostname: str, labels: Mapping[str, str], template: Doc) -> Doc:
    metadata = copy.deepcopy(template.get("metadata", {}))
    metadata["name"] = name
    metadata["labels"] = {**metadata.get("labels", {}), **labels}
    spec = copy.deepcopy(template["spec"])
    spec.update(hostname=hostname, restartPolicy="Never")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def pytorchjob_pods(job: Doc, *, port: int = PYTORCHJOB_PORT) -> list[Doc]:
    """The Master's and each Worker's pod, as the training operator v1 creates them."""
    name = job["metadata"]["name"]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    nodes = sum(int(replica.get("replicas", 1)) for replica in replicas.values())
    nproc = str(job["spec"].get("nprocPerNode", "auto"))
    rendered = []
    for rtype in ("Master", "Worker"):
        for index in range(int(replicas.get(rtype, {}).get("replicas", 0))):
            pod_name = f"{name}-{rtype.lower()}-{index}"
            labels = {
                "training.kubeflow.org/job-name": name,
                "training.kubeflow.org/replica-type": rtype.lower(),
                "training.kubeflow.org/replica-index": str(index),
            }
            pod = _pod(pod_name, pod_name, labels, replicas[rtype]["template"])
            env = operator.pytorchjob_env(
                name, rtype.lower(), index, pods=nodes, nproc=nproc, port=port
            )
            del env["HOSTNAME"]  # the kubelet's, from the pod's hostname
            _with_env(_named(pod["spec"]["containers"], "pytorch"), env)
            rendered.append(pod)
    return rendered


def _named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(item for item in items if item["name"] == name)


def _patched_pod_specs(patch: Doc) -> Iterator[tuple[str, dict[str, Any]]]:
    template = patch.get("trainingRuntimeSpec", {}).get("template", {})
    for job in template.get("spec", {}).get("replicatedJobs", []):
        yield job["name"], job["template"]["spec"]["template"]["spec"]


def _merge(base: Any, patch: Any) -> Any:
    """A strategic merge as Kubernetes does it for pod specs: lists of named items by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    named = isinstance(base, list) and all(isinstance(i, dict) and "name" in i for i in base)
    if named and isinstance(patch, list):
        merged_list = [copy.deepcopy(item) for item in base]
        for item in patch:
            names = [existing["name"] for existing in merged_list]
            if item.get("name") in names:
                at = names.index(item["name"])
                merged_list[at] = _merge(merged_list[at], item)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def trainjob_pods(job: Doc, *, port: int = TRAINJOB_PORT) -> list[Doc]:
    """The `node` pods of a TrainJob on the stock `torch-distributed` runtime.

    The runtime's template is one container named `node`; spec.trainer fills it, and the job's
    runtimePatches are merged into the pod spec.
    """
    name = job["metadata"]["name"]
    trainer = job["spec"]["trainer"]
    container = {"name": "node", "image": trainer["image"]}
    for key, source in (("command", "command"), ("args", "args"), ("env", "env")):
        if source in trainer:
            container[key] = copy.deepcopy(trainer[source])
    if "resourcesPerNode" in trainer:
        container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
    spec: dict[str, Any] = {"containers": [container]}
    for patch in job["spec"].get("runtimePatches", []):
        for job_name, patched in _patched_pod_specs(patch):
            if job_name == "node":
                spec = _merge(spec, patched)
    nodes, nproc = int(trainer.get("numNodes", 1)), str(trainer.get("numProcPerNode", "auto"))
    rendered = []
    for index in range(nodes):
        hostname = f"{name}-node-0-{index}"
        labels = {"jobset.sigs.k8s.io/jobset-name": name}
        # `<hostname>.<subdomain>` is the name the JobSet's headless Service gives the pod.
        pod = _pod(f"{hostname}.{name}", hostname, labels, {"spec": spec})
        pod["spec"]["subdomain"] = name
        env = operator.trainjob_env(name, index, nodes=nodes, nproc=nproc, port=port)
        del env["HOSTNAME"]
        _with_env(_named(pod["spec"]["containers"], "node"), env)
        rendered.append(pod)
    return rendered


# --- podman --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TmpfsVolume:
    """A podman volume standing in for one pod's memory emptyDir."""

    # The volume's (and its claim's) name.
    name: str
    # Its size in 4 KiB pages, from the emptyDir's sizeLimit (podman takes no tmpfs `size=`).
    pages: int
    # Its owner: the pod's runAsUser and fsGroup, as Kubernetes gives an emptyDir to fsGroup.
    uid: int
    gid: int


def for_podman(pods: Sequence[Doc]) -> tuple[list[Doc], list[TmpfsVolume]]:
    """The pods with each memory emptyDir turned into a claim on a tmpfs volume of its size, and
    each emptyDir on disk renamed after its pod, so that no two pods share it."""
    adapted, volumes = [], []
    for pod in pods:
        pod = copy.deepcopy(pod)
        security = pod["spec"].get("securityContext", {})
        for volume in pod["spec"].get("volumes", []):
            empty = volume.get("emptyDir", {})
            if "emptyDir" in volume and empty.get("medium") != "Memory":
                _rename_volume(pod, volume, f"{pod['metadata']['name']}-{volume['name']}")
            elif empty.get("medium") == "Memory":
                stand_in = TmpfsVolume(
                    name=f"{pod['metadata']['name']}-{volume['name']}".replace(".", "-"),
                    pages=_bytes(empty["sizeLimit"]) // 4096,
                    uid=int(security.get("runAsUser", 0)),
                    gid=int(security.get("fsGroup", security.get("runAsGroup", 0))),
                )
                del volume["emptyDir"]
                volume["persistentVolumeClaim"] = {"claimName": stand_in.name}
                volumes.append(stand_in)
        adapted.append(pod)
    return adapted, volumes


def _rename_volume(pod: Doc, volume: dict[str, Any], name: str) -> None:
    """Give `volume` of `pod` a new name, in the pod's volumes and in every mount of it."""
    name = name.replace(".", "-")
    for field_name in ("containers", "initContainers"):
        for container in pod["spec"].get(field_name, []):
            for mount in container.get("volumeMounts", []):
                if mount["name"] == volume["name"]:
                    mount["name"] = name
    volume["name"] = name


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * factor
    return int(quantity)


def container_name(pod: Doc, container: str) -> str:
    """The name podman gives `container` of `pod`."""
    return f"{pod['metadata']['name']}-{container}"


@contextlib.contextmanager
def host_address(network: str) -> Iterator[str]:
    """The host's address on `network` (its gateway), where pods on it reach a server on the host.

    CNI brings the network's bridge, and so this address, up with the first pod on it and down
    with the last: an idle pod holds it up meanwhile, so that a server can listen on it before
    the job's pods start. A server bound there is reachable from the pods and from this host, and
    nowhere else. (The pods also resolve `host.containers.internal` to it, but moto reads a host
    name as a bucket, virtual-host style, so the address itself is the endpoint.)
    """
    holder = f"{network}-host"
    podman("pod", "create", "--network", network, "--name", holder)
    try:
        podman("pod", "start", holder)
        info = json.loads(podman("network", "inspect", network).stdout)[0]
        yield str(info["subnets"][0]["gateway"])
    finally:
        podman("pod", "rm", "-f", holder, check=False)


@contextlib.contextmanager
def network() -> Iterator[str]:
    """A fresh podman network; with the dnsname plugin its pods resolve each other by name."""
    name = f"tb-{uuid.uuid4().hex[:8]}"
    podman("network", "create", name)
    try:
        yield name
    finally:
        podman("network", "rm", "-f", name, check=False)


@dataclass(frozen=True, kw_only=True)
class Played:
    """A set of pods started by `podman kube play`."""

    # The YAML that was played, for `podman kube down`.
    file: Path
    # Every training container's podman name, in pod order.
    containers: tuple[str, ...]
    # The podman volumes it made: the claim and the tmpfs stand-ins.
    volumes: tuple[str, ...]
    # The podman secrets it made from Secrets.
    secrets: tuple[str, ...] = ()


def play(docs: Sequence[Doc], containers: Sequence[str], *, network: str, file: Path) -> Played:
    """Create the tmpfs volumes and the secrets, then `podman kube play` the pods (and claims) in
    `docs`."""
    pods, volumes = for_podman([doc for doc in docs if doc["kind"] == "Pod"])
    secrets = tuple(_podman_secret(doc, file.parent) for doc in docs if doc["kind"] == "Secret")
    for volume in volumes:
        if podman("volume", "exists", volume.name, check=False).returncode != 0:
            # podman reads uid= and gid= itself and owns the tmpfs root by them.
            options = f"o=nr_blocks={volume.pages},uid={volume.uid},gid={volume.gid}"
            podman(
                "volume", "create", "--opt", "type=tmpfs", "--opt", "device=tmpfs",
                "--opt", options, volume.name,
            )  # fmt: skip
    others = [doc for doc in docs if doc["kind"] not in ("Pod", "Secret")]
    claims = [doc["metadata"]["name"] for doc in others if doc["kind"] == "PersistentVolumeClaim"]
    # Applying a claim again leaves the existing one and its data alone, as `kubectl apply` does;
    # podman would refuse to make its volume twice.
    others = [doc for doc in others if not _existing_claim(doc)]
    file.write_text(yaml.safe_dump_all([*others, *pods], sort_keys=False))
    played = Played(
        file=file,
        containers=tuple(containers),
        volumes=(*claims, *(volume.name for volume in volumes)),
        secrets=secrets,
    )
    try:
        podman("kube", "play", "--network", network, str(file), timeout=300)
    except RuntimeError:
        down(played)
        remove_volumes(*played.volumes)
        remove_secrets(*played.secrets)
        raise
    return played


def _podman_secret(secret: Doc, folder: Path) -> str:
    """A podman secret holding the Secret's data as the JSON object podman's kube play reads for
    envFrom and secretKeyRef (values base64, as in the Secret); an existing one is left alone,
    as `kubectl apply` leaves an unchanged Secret."""
    name = str(secret["metadata"]["name"])
    if podman("secret", "inspect", name, check=False).returncode != 0:
        data = dict(secret.get("data", {}))
        for key, value in secret.get("stringData", {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        source = folder / f"{name}.secret.json"
        source.write_text(json.dumps(data))
        try:
            podman("secret", "create", name, str(source))
        finally:
            source.unlink()
    return name


def _existing_claim(doc: Doc) -> bool:
    if doc["kind"] != "PersistentVolumeClaim":
        return False
    return podman("volume", "exists", doc["metadata"]["name"], check=False).returncode == 0


def wait(played: Played, *, timeout: float = 300) -> dict[str, int]:
    """Wait for every training container to exit; {container: exit code}."""
    proc = podman("wait", *played.containers, timeout=timeout)
    return dict(zip(played.containers, map(int, proc.stdout.split()), strict=True))


def down(played: Played) -> None:
    """Remove the pods (`podman kube down`); volumes stay, as a PVC outlives its job."""
    podman("kube", "down", str(played.file), check=False)


def logs(played: Played) -> str:
    """Every training container's whole output under a header naming it."""
    parts = []
    for name in played.containers:
        proc = podman("logs", name, check=False)
        parts.append(f"--- {name} ---\n{proc.stdout}{proc.stderr}")
    return "\n".join(parts)


def remove_secrets(*names: str) -> None:
    """Remove podman secrets."""
    for name in names:
        podman("secret", "rm", name, check=False)


def inspect(container: str) -> dict[str, Any]:
    """`podman inspect` of one container."""
    found: list[dict[str, Any]] = json.loads(podman("inspect", container).stdout)
    return found[0]


def volume_path(name: str) -> Path:
    """Where podman keeps volume `name` on this host."""
    info = json.loads(podman("volume", "inspect", name).stdout)[0]
    return Path(info["Mountpoint"])


def remove_volumes(*names: str) -> None:
    """Remove volumes, and whatever their runs wrote."""
    for name in names:
        podman("volume", "rm", "-f", name, check=False)


def run_in_image(image: str, volume: str, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run `argv` in the image (its entrypoint bypassed) with `volume` at /runs."""
    return podman(
        "run", "--rm", "-v", f"{volume}:/runs", "--entrypoint", argv[0], image, *argv[1:],
        timeout=600,
    )  # fmt: skip
