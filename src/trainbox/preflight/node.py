"""Read the non-GPU facts preflight judges: torch's CUDA build, /dev/shm, run_dir, the master."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
from pathlib import Path

from trainbox.preflight.checks import NodeFacts


def read(*, run_dir: Path, master_addr: str, shm: Path = Path("/dev/shm")) -> NodeFacts:
    """Gather NodeFacts without importing torch or touching CUDA."""
    existing = _nearest_existing(run_dir)
    return NodeFacts(
        torch_cuda=torch_cuda_version(),
        shm_mib=_size_mib(shm),
        run_dir_problem=_write_problem(run_dir, existing),
        disk_free_mib=_free_mib(existing),
        master_problem=_resolve_problem(master_addr),
    )


def torch_cuda_version() -> tuple[int, int] | None:
    """The CUDA version torch was built for, from torch/version.py (importing torch is slow)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*'(\d+)\.(\d+)", text, re.M)
    return (int(match[1]), int(match[2])) if match else None


def _size_mib(path: Path) -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize // 2**20


def _free_mib(path: Path) -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize // 2**20


def _nearest_existing(path: Path) -> Path:
    candidate = path.absolute()
    while not candidate.exists() and candidate != candidate.parent:
        candidate = candidate.parent
    return candidate


def _write_problem(run_dir: Path, existing: Path) -> str | None:
    # Nothing is created here: the trainer makes run_dir; preflight only asks whether it could.
    if not existing.is_dir():
        return f"run_dir={str(run_dir)!r} cannot be created: {existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        # Inside a container that is the image: say so, as no permission would ever help.
        why = "is on a read-only file system" if _read_only(existing) else "denies writes"
        return f"run_dir={str(run_dir)!r} is not writable ({existing} {why})"
    return None


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _resolve_problem(host: str) -> str | None:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as err:
        return f"MASTER_ADDR {host!r} does not resolve ({err})"
    return None
