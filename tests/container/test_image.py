"""The image, built here with podman, runs the built-in task as a non-root user, and two
containers rendezvous like two nodes through docker/compose.yaml."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

import tiers
from container.image import ROOT, podman

pytestmark = pytest.mark.slow
LOCK_SHA256 = hashlib.sha256((ROOT / "requirements-cpu.lock").read_bytes()).hexdigest()


def writable(path: Path) -> Path:
    """A host directory the image's uid 1000 can write to."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


def test_the_default_command_trains_the_built_in_task_as_non_root(
    built_image: str, tmp_path: Path
) -> None:
    runs = writable(tmp_path / "runs")
    proc = podman(
        "run",
        "--rm",
        "-v",
        f"{runs}:/runs",
        built_image,
        "run_dir=/runs/smoke",
        "train.max_steps=100",
    )
    assert "trained 100 steps: " in proc.stdout
    summary = json.loads((runs / "smoke" / "summary.json").read_text())
    assert (summary["steps"], summary["launcher"]) == (100, "single")
    assert podman("run", "--rm", built_image, "id", "-u").stdout.strip() == "1000"


def test_report_draws_a_run_in_the_image(built_image: str, tmp_path: Path) -> None:
    # matplotlib is in the image's locks: the README's `trainbox report` works in it as printed.
    runs = writable(tmp_path / "runs")
    volume = f"{runs}:/runs"
    podman("run", "--rm", "-v", volume, built_image, "run_dir=/runs/r", "train.max_steps=10")
    podman("run", "--rm", "-v", volume, built_image, "report", "/runs/r")
    assert (runs / "r" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_json_records_which_image_ran(built_image: str, tmp_path: Path) -> None:
    runs = writable(tmp_path / "runs")
    podman(
        "run", "--rm", "-v", f"{runs}:/runs", built_image, "run_dir=/runs/r", "train.max_steps=10"
    )
    inspected = json.loads(podman("image", "inspect", built_image).stdout)[0]
    labels = inspected["Labels"]
    recorded = json.loads((runs / "r" / "run.json").read_text())["image"]
    assert recorded["revision"] == labels["org.opencontainers.image.revision"] != "unknown"
    # The label and the image's own date are both the commit's time (--timestamp).
    created = datetime.fromisoformat(inspected["Created"].replace("Z", "+00:00"))
    assert recorded["created"] == labels["org.opencontainers.image.created"]
    assert recorded["created"] == created.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert labels["org.opencontainers.image.version"] == recorded["version"]
    assert recorded["lock_sha256"] == LOCK_SHA256


def test_doctor_shows_the_lock_hash_and_revision_the_image_was_built_from(built_image: str) -> None:
    report = json.loads(podman("run", "--rm", built_image, "doctor", "--json").stdout)
    assert report["image"]["lock_sha256"] == LOCK_SHA256
    assert report["image"]["revision"] not in (None, "unknown")
    assert f"lock_sha256={LOCK_SHA256}" in podman("run", "--rm", built_image, "doctor").stdout


def test_the_image_carries_its_lock_and_a_bill_of_materials(built_image: str) -> None:
    show = "cat /opt/trainbox/provenance/requirements.lock /opt/trainbox/provenance/sbom.cdx.json"
    out = podman("run", "--rm", built_image, "sh", "-c", show).stdout
    lock_text = (ROOT / "requirements-cpu.lock").read_text()
    assert out.startswith(lock_text)
    bom = json.loads(out[len(lock_text) :])
    names = {component["name"] for component in bom["components"]}
    assert {"torch", "numpy", "trainbox", "python3.11", "tini"} <= names
    assert {"pip", "setuptools"}.isdisjoint(names)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["doctor", "--json"], '"launcher":"single"'),
        (["sh", "-c", "command -v trainbox python3 tini"], "/opt/trainbox/bin/trainbox"),
        (["sh", "-c", "echo $PYTHONUNBUFFERED $NVIDIA_DRIVER_CAPABILITIES"], "1 compute,utility"),
    ],
    ids=["subcommand", "anything-else-runs-as-is", "settings-live-in-env"],
)
def test_entrypoint_dispatch_and_environment(
    built_image: str, args: list[str], expected: str
) -> None:
    assert expected in podman("run", "--rm", built_image, *args).stdout


def test_tini_is_pid_1(built_image: str) -> None:
    # tini reaps zombies and forwards SIGTERM/SIGUSR1 to trainbox, which as PID 1 would ignore them.
    ps = podman("run", "--rm", built_image, "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '").stdout
    assert ps.startswith("tini -s -- trainbox-entrypoint")


def test_two_containers_rendezvous_like_two_nodes(built_image: str, tmp_path: Path) -> None:
    compose = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
    if not Path(compose).exists():
        tiers.unavailable("podman-compose is not installed (pip install podman-compose)")
    runs = writable(tmp_path / "runs")
    project = f"tb{uuid.uuid4().hex[:8]}"
    argv = [compose, "-p", project, "-f", str(ROOT / "docker" / "compose.yaml"), "--profile", "cpu"]
    env = {
        "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
        "TRAINBOX_IMAGE": built_image,
        "TRAINBOX_RUNS": str(runs),
    }
    try:
        up = subprocess.run(
            [*argv, "up", "--abort-on-container-exit"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        # podman-compose exits 0 even when a container failed: the files say whether it trained.
        written = runs / "two-nodes" / "summary.json"
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert written.exists(), up.stdout[-3000:] + up.stderr[-3000:]
        summary = json.loads(written.read_text())
        assert (summary["world_size"], summary["launcher"], summary["steps"]) == (2, "env", 300)
        assert "trained 300 steps" in up.stdout
    finally:
        subprocess.run([*argv, "down"], env=env, capture_output=True, timeout=120, check=False)
