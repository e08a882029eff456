"""Build the trainbox image for real with podman: a debootstrapped Debian base, a wheelhouse, no index.

No image registry is reachable from the test machines, so the base is bootstrapped from Debian's
archive with debootstrap (about a minute) and imported; the Dockerfile is the one users build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# "-slim": without debootstrap's package lists and .deb cache, like debian:bookworm-slim.
BASE = "localhost/trainbox-base:bookworm-slim"
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
        # 94 MB that debian:bookworm-slim does not carry, and the image never reads.
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "import", "-", BASE], stdin=tar.stdout, check=True, capture_output=True
        )
        tar.wait()


def source_date_epoch() -> int:
    """The commit's time: every timestamp in the image is clamped to it."""
    out = subprocess.run(
        ["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return int(out) if out.isdigit() else 0


def build(revision: str, epoch: int, tag: str = IMAGE) -> str:
    """Fill the wheelhouse and build the image with no cache, its times clamped to `epoch`;
    returns its ID."""
    configure()
    ensure_base()
    subprocess.run(
        [str(ROOT / "scripts" / "wheelhouse"), "cpu"], check=True, capture_output=True, timeout=600
    )
    return build_reproducibly(ROOT, revision=revision, epoch=epoch, variant="cpu", tag=tag)


def build_reproducibly(
    context: Path, *, revision: str, epoch: int, variant: str, tag: str, timeout: float = 1800
) -> str:
    """`podman build` of `context` with the documented reproducible flags and no cache, every
    time clamped to `epoch`; returns the image ID."""
    created = datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with tempfile.TemporaryDirectory() as tmp:
        iid = Path(tmp) / "iid"
        podman(
            "build", "--no-cache", "--timestamp", str(epoch), "--iidfile", str(iid),
            "--build-arg", f"SOURCE_DATE_EPOCH={epoch}", "--build-arg", f"VARIANT={variant}",
            "--build-arg", f"BASE_IMAGE={BASE}", "--build-arg", f"REVISION={revision}",
            "--build-arg", f"CREATED={created}", "-t", tag, str(context), timeout=timeout,
        )  # fmt: skip
        return iid.read_text().strip().removeprefix("sha256:")


def differing_paths(first: str, second: str) -> list[str]:
    """Paths whose bytes, mode, owner or time differ between two images' file trees."""
    trees = []
    for image_id in (first, second):
        root = Path(podman("image", "mount", image_id).stdout.strip())
        try:
            trees.append(_fingerprints(root))
        finally:
            podman("image", "unmount", image_id, check=False)
    a, b = trees
    return sorted(path for path in a.keys() | b.keys() if a.get(path) != b.get(path))


def _fingerprints(root: Path) -> dict[str, tuple[object, ...]]:
    found: dict[str, tuple[object, ...]] = {}
    for path in root.rglob("*"):
        info = path.lstat()
        digest = (
            hashlib.sha256(path.read_bytes()).hexdigest()
            if stat.S_ISREG(info.st_mode)
            else os.readlink(path)
            if path.is_symlink()
            else ""
        )
        found[str(path.relative_to(root))] = (
            info.st_mode,
            info.st_uid,
            info.st_gid,
            int(info.st_mtime),
            digest,
        )
    return found
