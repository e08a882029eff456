"""Carry out a CpuPlan: pin every thread of this process and size the thread pools.

Call `apply` before torch is imported: thread pools, NCCL and CUDA threads started later inherit
the pinned mask, and memory first touched after pinning lands on the near NUMA node.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from trainbox.affinity.plan import CpuPlan

# Variables that size OpenMP/MKL pools (torch's intra-op pool reads OMP_NUM_THREADS at import).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# The DataLoader workers trainbox would start: a script behind `exec` may read it.
WORKERS_VAR = "TRAINBOX_NUM_WORKERS"
# Threads can start while we pin; re-list until a pass finds none new, but never loop forever.
MAX_PASSES = 5

SetAffinity = Callable[[int, Iterable[int]], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class Applied:
    """What `apply` changed, for the rank's log line and doctor."""

    # Thread ids whose affinity was set; empty when the plan keeps or leaves affinity alone.
    pinned_threads: tuple[int, ...]
    # Thread variables set to the plan's num_threads.
    env_set: tuple[str, ...]
    # Thread variables the user had already set, left as they were.
    env_kept: tuple[str, ...]


def apply(
    plan: CpuPlan,
    env: MutableMapping[str, str],
    *,
    task_dir: Path = Path("/proc/self/task"),
    set_affinity: SetAffinity = os.sched_setaffinity,
) -> Applied:
    """Pin all threads to plan.cpus (unless kept/off); export thread and worker counts to `env`."""
    pinned: tuple[int, ...] = ()
    if plan.mode not in ("kept", "off"):
        pinned = _pin_all_threads(plan.cpus, task_dir, set_affinity)
    kept = tuple(name for name in THREAD_VARS if env.get(name, "").strip())
    # MKL reads OMP_NUM_THREADS when its own variable is unset: a user's OMP count rules both.
    written = tuple(
        name for name in THREAD_VARS if name not in kept and "OMP_NUM_THREADS" not in kept
    )
    for name in written:
        env[name] = str(plan.num_threads)
    env[WORKERS_VAR] = str(plan.num_workers)
    return Applied(pinned_threads=pinned, env_set=written, env_kept=kept)


def set_torch_threads(plan: CpuPlan) -> None:
    """Size torch's intra-op pool to plan.num_threads (imports torch: call after `apply`)."""
    import torch

    torch.set_num_threads(plan.num_threads)


def worker_init(plan: CpuPlan) -> Callable[[int], None]:
    """A DataLoader `worker_init_fn`: one thread per worker, on the rank's CPUs (picklable)."""
    cpus = tuple(sorted(plan.cpus)) if plan.mode in ("exclusive", "node") else None
    return functools.partial(_init_worker, cpus)


def _init_worker(cpus: tuple[int, ...] | None, _worker_id: int) -> None:
    import torch

    # Several workers per rank each with a full pool would oversubscribe the rank's budget.
    torch.set_num_threads(1)
    for name in THREAD_VARS:
        os.environ[name] = "1"
    if cpus is not None:
        # Workers inherit the rank's mask, but Intel OpenMP resets affinity after fork.
        os.sched_setaffinity(0, cpus)


def _pin_all_threads(
    cpus: frozenset[int], task_dir: Path, set_affinity: SetAffinity
) -> tuple[int, ...]:
    # The calling thread first: threads it starts from now on inherit its mask.
    set_affinity(0, cpus)
    done: set[int] = set()
    for _ in range(MAX_PASSES):
        new = _thread_ids(task_dir) - done
        if not new:
            break
        for tid in sorted(new):
            # A thread may end between listing and pinning.
            with contextlib.suppress(ProcessLookupError):
                set_affinity(tid, cpus)
            done.add(tid)
    return tuple(sorted(done))


def _thread_ids(task_dir: Path) -> set[int]:
    try:
        return {int(entry.name) for entry in task_dir.iterdir() if entry.name.isdigit()}
    except OSError:
        return set()
