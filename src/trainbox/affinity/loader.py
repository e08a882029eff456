"""Torch's threads once a dataset says how many DataLoader workers can help it."""

from __future__ import annotations

from trainbox.affinity.apply import set_torch_threads
from trainbox.affinity.plan import CpuPlan, with_workers


def for_dataset(
    plan: CpuPlan, max_workers: int | None, *, auto_workers: bool, auto_threads: bool
) -> CpuPlan:
    """The plan for a dataset capped at `max_workers`; spare workers' CPUs become threads."""
    if max_workers is None or not auto_workers:
        return plan
    return with_workers(
        plan,
        max_workers,
        reason="the dataset holds its samples in memory",
        grow_threads=auto_threads,
    )


def size_threads(
    plan: CpuPlan | None, max_workers: int | None, *, auto_workers: bool, auto_threads: bool
) -> CpuPlan | None:
    """Size torch's threads for the dataset's plan and return that plan (None: not planned)."""
    if plan is None:
        return None
    sized = for_dataset(plan, max_workers, auto_workers=auto_workers, auto_threads=auto_threads)
    set_torch_threads(sized)
    return sized
