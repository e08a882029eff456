"""Build the trainbox image for real with podman: a debootstrapped Debian base, a wheelhouse, no index.

No image registry is reachable from the test machines, so the base is bootstrapped from Debian's
archive with debootstrap (about a minute) and imported; the Dockerfile is the one users build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/trainbox-base:bookworm"
IMAGE = "localhost/trainbox:test"
MIRROR = "http://deb.debian.org/debian"
# The test machines' kernel refuses podman's default runtime (crun) and its high ulimits.
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=4096:4096", "nproc=16384:16384"]

[engine]
runtime = "runc"
"""


def missing_requirements() -> str | None:
    """Why the container tier cannot run here, or None."""
    if os.geteuid() != 0:
        return "building images needs root here (rootless podman is not set up)"
    missing = [name for name in ("podman", "runc", "debootstrap") if shutil.which(name) is None]
    return f"missing commands: {', '.join(missing)} (see .ci/install-system)" if missing else None


def podman(
    *args: str, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run podman, failing with its output when `check` and it fails."""
    proc = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"podman {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def configure() -> None:
    """Point podman at runc with the limits this kernel accepts, once."""
    conf = Path("/etc/containers/containers.conf")
    if not conf.exists():
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(CONTAINERS_CONF)


def ensure_base() -> None:
    """Bootstrap Debian bookworm with python3, venv and tini, and import it (about a minute)."""
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        packages = "python3,python3-venv,ca-certificates,tini"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={packages}", "bookworm", str(root), MIRROR],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "import", "-", BASE], stdin=tar.stdout, check=True, capture_output=True
        )
        tar.wait()


def build(revision: str) -> str:
    """Fill the wheelhouse and build the image from the repository's Dockerfile; returns its name."""
    configure()
    ensure_base()
    subprocess.run(
        [str(ROOT / "scripts" / "wheelhouse")], check=True, capture_output=True, timeout=600
    )
    podman(
        "build", "--build-arg", f"BASE_IMAGE={BASE}", "--build-arg", f"REVISION={revision}",
        "--build-arg", "CREATED=2026-11-22T00:00:00Z", "-t", IMAGE, str(ROOT), timeout=1800,
    )  # fmt: skip
    return IMAGE
