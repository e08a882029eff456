"""Read the non-GPU facts preflight judges: torch's CUDA build, /dev/shm, run_dir, the master."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

from trainbox.errors import StorageError
from trainbox.preflight import fabric
from trainbox.preflight.checks import NodeFacts
from trainbox.storage.location import Location
from trainbox.storage.store import Store, probe_timeouts


def read(
    *,
    run_dir: Path,
    master_addr: str,
    env: Mapping[str, str] | None = None,
    shm: Path = Path("/dev/shm"),
    store: Location | None = None,
    probe_store: bool = False,
    store_timeout_s: float = 60.0,
) -> NodeFacts:
    """Gather NodeFacts without importing torch or touching CUDA (the fabric only given `env`).

    `store`: run_dir's place in an object store, probed when `probe_store` (one process per node).
    """
    existing = _nearest_existing(run_dir)
    probed = store is not None and probe_store
    problem = _store_problem(store, store_timeout_s) if store is not None and probed else None
    return NodeFacts(
        torch_cuda=torch_cuda_version(),
        shm_mib=_size_mib(shm),
        run_dir_problem=_write_problem(run_dir, existing),
        disk_free_mib=_free_mib(existing),
        master_problem=_resolve_problem(master_addr),
        fabric=None if env is None else read_fabric(env),
        run_dir=str(run_dir),
        nvidia_devices=nvidia_devices(),
        store_url=store.url if store is not None else "",
        store_problem=problem,
        store_probed=store is not None and probe_store,
    )


def _store_problem(store: Location, timeout_s: float) -> tuple[str, str] | None:
    """Why a probe object cannot be written and deleted under `store`: (message, hint), or None.

    Bounded by the probe's timeouts: an endpoint that never answers fails within a minute.
    """
    try:
        Store(store, timeouts=probe_timeouts(timeout_s)).probe()
    except StorageError as err:
        return "; ".join(err.problems), err.hint
    return None


# PCI vendor ID of NVIDIA's GPUs (and of their audio and NVSwitch functions).
NVIDIA_VENDOR = "0x10de"


def nvidia_devices(root: Path = Path("/")) -> bool:
    """Whether this machine shows an NVIDIA device: its kernel module, a /dev/nvidia* node or a
    PCI function of NVIDIA's vendor ID (visible in a container not given the GPUs too)."""
    if (root / "proc/driver/nvidia").exists():
        return True
    if any(child.name.startswith("nvidia") for child in _children(root / "dev")):
        return True
    return any(
        _text(device / "vendor").strip().lower() == NVIDIA_VENDOR
        for device in _children(root / "sys/bus/pci/devices")
    )


def read_fabric(env: Mapping[str, str], *, root: Path = Path("/")) -> fabric.FabricFacts:
    """RDMA ports, NIC speeds, the verbs library and NCCL's knobs; `root` is a fake tree in tests.

    A few dozen small sysfs reads: no subprocess, no ibstat.
    """
    return fabric.FabricFacts(
        ports=tuple(_rdma_ports(root / "sys/class/infiniband")),
        nics=tuple(
            fabric.Nic(name=path.name, speed_mbps=fabric.parse_speed(_text(path / "speed")))
            for path in _children(root / "sys/class/net")
        ),
        verbs_error=verbs_error(),
        uverbs_devices=any(p.name.startswith("uverbs") for p in _children(root / "dev/infiniband")),
        nccl_env=fabric.knobs(env),
    )


def verbs_error(library: str = fabric.VERBS_LIBRARY) -> str | None:
    """Why this process cannot dlopen `library` as NCCL will; None when it can."""
    try:
        ctypes.CDLL(library)
    except OSError as err:
        return str(err)
    return None


def _rdma_ports(base: Path) -> list[fabric.RdmaPort]:
    found = []
    for device in _children(base):
        for port in _children(device / "ports"):
            if not port.name.isdigit():
                continue
            found.append(
                fabric.RdmaPort(
                    device=device.name,
                    port=int(port.name),
                    state=fabric.parse_state(_text(port / "state")),
                    rate_gbps=fabric.parse_rate(_text(port / "rate")),
                    link_layer=_text(port / "link_layer").strip(),
                )
            )
    return found


def _children(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir(), key=lambda child: child.name)
    except OSError:
        return []


def _text(path: Path) -> str:
    # A NIC that is down answers EINVAL to a read of its speed: that is "unknown", not an error.
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


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
