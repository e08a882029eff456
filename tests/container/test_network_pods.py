"""`trainbox doctor --network` in the real image: three pods on one podman network, one of them
behind a throttled NIC, must be named as the slow node (exit 3).

Each container is one PyTorchJob pod with one process (a 3-node ring: with 3 nodes a slow node
can be told from a slow link), started with the variables the training operator injects.

The throttle: the image has no iproute2 (`tc`), and adding it would grow the image for a test's
sake, so the test enters the container's network namespace from the host with `nsenter` and
runs the host's `tc` there; the container needs no NET_ADMIN. This kernel has no netem qdisc
(`tc qdisc add ... netem` answers "Specified qdisc kind is unknown"), so the throttle is a token
bucket (`tbf`) on the container's eth0: a rate limit, which is what a bad cable or a NIC that
negotiated a lower speed looks like anyway.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import tiers
from container import kube
from container.image import podman
from launchers import pods as operator

pytestmark = pytest.mark.slow

# Pod names, exit codes, and each pod's (stdout, stderr).
Pods = tuple[list[str], list[int], list[tuple[str, str]]]

NODES = 3
SLOW = 1  # the pod whose NIC is throttled: rank 1, the first Worker
# 4 Mbit/s out of the slow pod, against GB/s over the veth pairs of the others.
THROTTLE = ["tbf", "rate", "4mbit", "burst", "32kbit", "latency", "400ms"]
# Small sizes keep the throttled pod's sweep to a few seconds; a cut-off of 0.2 leaves room for
# this box's busy CPUs while the throttled links are about 100 times slower.
CHECK = [
    "doctor", "--network", "--json", "--network-max-bytes", "64K",
    "--network-min-fraction", "0.2", "preflight.gpus=auto", "dist.timeout_s=120",
]  # fmt: skip


def _start(image: str, network: str, name: str, env: dict[str, str]) -> None:
    flags = [f"--env={key}={value}" for key, value in env.items()]
    podman(
        "run", "-d", "--name", name, "--hostname", name, "--network", network, *flags,
        image, *CHECK,
    )  # fmt: skip


def _throttle(container: str) -> None:
    pid = podman("inspect", "--format", "{{.State.Pid}}", container).stdout.strip()
    subprocess.run(
        ["nsenter", "-t", pid, "-n", "tc", "qdisc", "add", "dev", "eth0", "root", *THROTTLE],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@contextlib.contextmanager
def _pods(image: str) -> Iterator[Pods]:
    """Master, throttled Worker, then the last Worker: the throttle is on before the ring can
    meet (the master waits for every rank). Yields names, exit codes and each pod's output."""
    job = f"tbnet{uuid.uuid4().hex[:6]}"
    every = operator.pytorchjob_pods(job, pods=NODES, nproc="1", port=kube.PYTORCHJOB_PORT)
    names = [env.pop("HOSTNAME") for env in every]
    with kube.network() as network:
        try:
            for rank, (name, env) in enumerate(zip(names, every, strict=True)):
                _start(image, network, name, env)
                if rank == SLOW:
                    _throttle(name)
            codes = [int(code) for code in podman("wait", *names, timeout=300).stdout.split()]
            logs = [podman("logs", name) for name in names]
            yield names, codes, [(proc.stdout, proc.stderr) for proc in logs]
        finally:
            podman("rm", "-f", *names, check=False)


@pytest.fixture(scope="module")
def throttled(built_image: str) -> Iterator[Pods]:
    missing = [tool for tool in ("nsenter", "tc") if shutil.which(tool) is None]
    if missing:
        tiers.unavailable(f"missing commands: {', '.join(missing)} (util-linux, iproute2)")
    with _pods(built_image) as found:
        yield found


def _report(stdout: str) -> dict[str, Any]:
    (line,) = stdout.splitlines()  # rank 0's one JSON object, nothing else
    found: dict[str, Any] = json.loads(line)
    return found


def test_the_throttled_pod_is_named_as_the_slow_node_and_every_pod_exits_3(
    throttled: Pods,
) -> None:
    names, codes, outputs = throttled
    assert codes == [3, 3, 3], outputs
    stdout, stderr = outputs[0]
    verdict = _report(stdout)["verdict"]
    assert verdict["slow_nodes"] == [names[SLOW]], stdout
    (line,) = [line for line in stderr.splitlines() if line.startswith("trainbox: error:")]
    assert line.startswith(f"trainbox: error: network: slow node: {names[SLOW]} (")
    assert "HINT: check the named host's NIC" in line


def test_only_the_throttled_pod_s_links_are_slow(
    throttled: Pods,
) -> None:
    names, _, outputs = throttled
    found = _report(outputs[0][0])
    assert found["ring"] == {"size": 3, "of": "nodes", "lanes": 1, "link_bytes": 65536}
    slow = sorted((k["source_name"], k["target_name"]) for k in found["links"] if k["slow"])
    assert slow == sorted([(names[0], names[1]), (names[1], names[2])])
    # The other ranks print nothing, not even the error: rank 0 speaks for the job.
    assert [stdout for stdout, _ in outputs[1:]] == ["", ""]
    assert not any("trainbox: error" in stderr for _, stderr in outputs[1:])
