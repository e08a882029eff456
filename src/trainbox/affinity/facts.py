"""CpuFacts: which CPUs this process may use and how much of them, read from procfs and sysfs.

`read` is the only side-effecting part of the package's planning half; everything it finds is
plain data that `plan` judges. Unreadable files mean "unknown", never an error.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainbox.launch import hostlist, slurm

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


@dataclass(frozen=True, kw_only=True, slots=True)
class CpuFacts:
    """What bounds this process's CPU use: its affinity, the cgroup quota, Slurm's allocation."""

    # CPUs this process may run on (sched_getaffinity: Slurm/k8s/docker cpusets, taskset, numactl).
    affinity: frozenset[int]
    # CPUs online on the machine (/sys/devices/system/cpu/online); empty when unknown.
    online: frozenset[int] = frozenset()
    # CPU quota in CPUs (quota/period), the smallest over this cgroup and its ancestors; None: none.
    quota: float | None = None
    # SLURM_CPUS_PER_TASK of the srun step this process runs in; None outside a step.
    slurm_cpus_per_task: int | None = None
    # srun tasks on this node in this step (this node's SLURM_STEP_TASKS_PER_NODE entry).
    slurm_tasks_on_node: int | None = None
    # SLURM_CPU_BIND_TYPE set by srun for this step's tasks (e.g. `mask_cpu:`, `quiet,none`).
    slurm_cpu_bind: str | None = None
    # SLURM_CPUS_ON_NODE of the srun step: the CPUs Slurm allocated on this node; None outside.
    slurm_cpus_on_node: int | None = None
    # Physical cores as sets of hyperthread siblings, ordered by lowest CPU; empty when unknown.
    cores: tuple[frozenset[int], ...] = ()


def read(
    env: Mapping[str, str], *, root: Path = Path("/"), affinity: Iterable[int] | None = None
) -> CpuFacts:
    """Read this process's CPU facts; with `root` other than / read a fake tree (tests, doctor)."""
    if affinity is not None:
        allowed = frozenset(affinity)
    elif root == Path("/"):
        allowed = frozenset(os.sched_getaffinity(0))
    else:
        allowed = _status_cpus(root / "proc/self/status")
    online = _cpulist_file(root / "sys/devices/system/cpu/online")
    if not allowed:
        # A status file without Cpus_allowed_list: assume no cpuset rather than no CPUs.
        allowed = online
    step = _slurm_step(env)
    return CpuFacts(
        affinity=allowed,
        online=online,
        quota=cgroup_quota(root),
        slurm_cpus_per_task=_positive_int(env.get("SLURM_CPUS_PER_TASK")) if step else None,
        slurm_tasks_on_node=_tasks_on_node(env) if step else None,
        slurm_cpu_bind=(env.get("SLURM_CPU_BIND_TYPE") or None) if step else None,
        slurm_cpus_on_node=_positive_int(env.get("SLURM_CPUS_ON_NODE")) if step else None,
        cores=_cores(root / "sys/devices/system/cpu"),
    )


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse the kernel's CPU list format, e.g. `0-3,8,10-11`; raise ValueError if malformed."""
    cpus: set[int] = set()
    for item in text.strip().split(","):
        if not item.strip():
            continue
        match = _RANGE.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{item!r} is not N or N-M")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        if last < first:
            raise ValueError(f"{item!r} is a descending range")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Write CPUs in the kernel's compact list format, e.g. `0-3,8,10-11`."""
    ordered = sorted(set(cpus))
    pieces: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            pieces.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(pieces)


def cgroup_quota(root: Path) -> float | None:
    """The tightest CPU quota, in CPUs, over this process's cgroup and its ancestors (v2 and v1)."""
    quotas: list[float | None] = []
    base = root / "sys/fs/cgroup"
    for line in _text(root / "proc/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and not controllers:
            # Unified (v2) at /sys/fs/cgroup, or under unified/ on a hybrid host.
            for mount in (base, base / "unified"):
                quotas += (_v2_quota(d) for d in _levels(mount, path))
        elif "cpu" in controllers.split(","):
            for name in dict.fromkeys((controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu")):
                quotas += (_v1_quota(d) for d in _levels(base / name, path))
    found = [q for q in quotas if q is not None and q > 0]
    return min(found) if found else None


def _levels(mount: Path, path: str) -> Iterator[Path]:
    # Limits of every ancestor apply too (loky reads them the same way). A path that does not
    # exist under the mount means a container without its own cgroup namespace whose mount shows
    # its own cgroup as the root: read just that.
    if not mount.is_dir():
        return
    here = mount / path.strip("/")
    if not here.is_dir():
        yield mount
        return
    while True:
        yield here
        if here == mount:
            return
        here = here.parent


def _v2_quota(directory: Path) -> float | None:
    fields = _text(directory / "cpu.max").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1_quota(directory: Path) -> float | None:
    return _ratio(
        _text(directory / "cpu.cfs_quota_us").strip(),
        _text(directory / "cpu.cfs_period_us").strip(),
    )


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    # -1 (v1) means unlimited; a zero period would be a kernel bug, not a quota.
    if q <= 0 or p <= 0:
        return None
    ratio = q / p
    return ratio if math.isfinite(ratio) else None


def _status_cpus(path: Path) -> frozenset[int]:
    for line in _text(path).splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            return _cpulist(value)
    return frozenset()


def _cores(cpu_dir: Path) -> tuple[frozenset[int], ...]:
    cores = {
        _cpulist_file(path)
        for path in cpu_dir.glob("cpu[0-9]*/topology/thread_siblings_list")
        if path.parent.parent.name[3:].isdigit()
    }
    return tuple(sorted((c for c in cores if c), key=min))


def _slurm_step(env: Mapping[str, str]) -> bool:
    # Only an srun task's SLURM_* describe this process: the batch shell carries per-task values
    # for tasks it has not started, and stale ones leak into containers.
    return bool(env.get("SLURM_JOB_ID")) and slurm.step_id(env) is not None


def _tasks_on_node(env: Mapping[str, str]) -> int | None:
    node = env.get("SLURM_NODEID", "")
    text = env.get("SLURM_STEP_TASKS_PER_NODE")
    if not text or not (node.isascii() and node.isdigit()):
        return None
    try:
        return hostlist.task_counts(text).on_node(int(node))
    except ValueError:
        return None


def _positive_int(text: str | None) -> int | None:
    if text is None or not (text.strip().isascii() and text.strip().isdigit()):
        return None
    value = int(text.strip())
    return value if value > 0 else None


def _cpulist_file(path: Path) -> frozenset[int]:
    return _cpulist(_text(path))


def _cpulist(text: str) -> frozenset[int]:
    try:
        return parse_cpulist(text)
    except ValueError:
        return frozenset()


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""
