"""CpuPlan: which CPUs a local rank runs on and how many threads and workers it starts (pure).

Every local rank computes the whole node's partition from the same inputs, so the answers agree
without communication. The rules (how the CPUs are shared, the budget, which CPUs, threads
and workers) have one home: docs/pinning.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from trainbox.affinity.facts import CpuFacts, format_cpulist
from trainbox.errors import UsageError

MODES = ("auto", "exclusive", "node", "off")
# More workers rarely help one GPU and each costs a process's memory; explicit values may exceed.
MAX_WORKERS = 8
HINT = "set pinning.mode to one of auto|exclusive|node|off and thread/worker counts to integers"


@dataclass(frozen=True, kw_only=True, slots=True)
class CpuPlan:
    """This local rank's CPUs and thread counts, with the reasons behind them."""

    # CPUs this rank runs on (the whole affinity when mode is kept or off).
    cpus: frozenset[int]
    # Intra-op threads for torch.set_num_threads, OMP_NUM_THREADS and MKL_NUM_THREADS.
    num_threads: int
    # DataLoader worker processes.
    num_workers: int
    # What was done to the affinity: exclusive|node|kept|off.
    mode: str
    # CPUs this rank may keep busy (main process plus its workers).
    budget: int
    # Human-readable reasons for caps, fallbacks and warnings, in the order they were decided.
    notes: tuple[str, ...] = ()


def plan(
    cpu: CpuFacts,
    *,
    local_rank: int,
    local_world_size: int,
    gpu_cpus: Sequence[frozenset[int] | None],
    mode: str = "auto",
    num_threads: int | None = None,
    num_workers: int | None = None,
    max_workers: int | None = None,
) -> CpuPlan:
    """Decide this local rank's CPUs, budget, threads and workers from the node's facts.

    `max_workers` caps the automatic worker count (e.g. by what /dev/shm can hold).
    """
    _validate(cpu, local_rank, local_world_size, mode, num_threads, num_workers)
    notes: list[str] = []
    ranks = local_world_size
    tasks = cpu.slurm_tasks_on_node == ranks
    own = ranks == 1 or (tasks and (_srun_bound(cpu) or _within_cpus_per_task(cpu)))
    share = 1 if own else ranks
    budget = _budget(cpu, share=share, ranks=ranks, tasks=tasks, notes=notes)
    near = _near(cpu.affinity, gpu_cpus, ranks)
    if near[local_rank] is None and _at(gpu_cpus, local_rank):
        notes.append(
            f"affinity {format_cpulist(cpu.affinity)} excludes every CPU near this rank's GPU "
            f"({format_cpulist(_at(gpu_cpus, local_rank) or ())}): using the affinity"
        )
    chosen, cpus = _place(cpu, mode=mode, own=own, near=near, local_rank=local_rank, notes=notes)
    if chosen == "node" and share > 1:
        sharers = sum(1 for n in near if (n or cpu.affinity) == cpus) or 1
        if sharers > 1 and len(cpus) // sharers < budget:
            budget = max(1, len(cpus) // sharers)
            notes.append(f"{len(cpus)} CPUs near the GPU shared by {sharers} ranks: {budget} each")
    if len(cpus) < budget:
        budget = len(cpus)
        notes.append(f"budget limited to the {budget} CPUs pinned")
    threads, workers = _size(budget, num_threads, num_workers, notes, max_workers)
    return CpuPlan(
        cpus=cpus,
        num_threads=threads,
        num_workers=workers,
        mode=chosen,
        budget=budget,
        notes=tuple(notes),
    )


def srun_binding(value: str | None) -> bool:
    """Whether a SLURM_CPU_BIND_TYPE value means srun bound the task (`none` and blank do not)."""
    words = [w for w in (value or "").lower().split(",") if w and w not in ("quiet", "verbose")]
    return bool(words) and words != ["none"]


def _validate(
    cpu: CpuFacts,
    local_rank: int,
    local_world_size: int,
    mode: str,
    num_threads: int | None,
    num_workers: int | None,
) -> None:
    if not cpu.affinity:
        raise ValueError("CpuFacts.affinity is empty")
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank {local_rank} outside local_world_size {local_world_size}")
    problems = []
    if mode not in MODES:
        problems.append(f"pinning mode {mode!r} is not one of {', '.join(MODES)}")
    if num_threads is not None and num_threads < 1:
        problems.append(f"num_threads={num_threads} is below 1")
    if num_workers is not None and num_workers < 0:
        problems.append(f"num_workers={num_workers} is negative")
    if problems:
        raise UsageError(problems, hint=HINT)


def _srun_bound(cpu: CpuFacts) -> bool:
    return srun_binding(cpu.slurm_cpu_bind)


def _within_cpus_per_task(cpu: CpuFacts) -> bool:
    return cpu.slurm_cpus_per_task is not None and len(cpu.affinity) <= cpu.slurm_cpus_per_task


def _budget(cpu: CpuFacts, *, share: int, ranks: int, tasks: bool, notes: list[str]) -> int:
    budget = max(1, len(cpu.affinity) // share)
    if share > 1:
        notes.append(f"affinity of {len(cpu.affinity)} CPUs shared by {share} local ranks")
        if len(cpu.affinity) < share:
            notes.append(f"fewer CPUs than local ranks: {share} ranks oversubscribe them")
    if cpu.quota is not None:
        # Floor, not ceil: a rank that may burst to 3 CPUs under a 2.5 CPU quota gets throttled.
        cap = max(1, math.floor(cpu.quota / ranks + 1e-9))
        if cap < budget:
            budget = cap
            notes.append(
                f"cgroup quota {cpu.quota:g} CPUs shared by {_count(ranks, 'rank')}: {cap} each"
            )
    on_node = cpu.slurm_cpus_on_node
    if on_node is not None and _kept_reason(cpu) is None:
        # Nothing confines the step's tasks (no cpuset narrower than the machine, no srun
        # binding: TaskPlugin=task/none), yet Slurm allocated the job only these CPUs here and
        # may give the rest to other jobs. A confined set already is the allocation, and
        # SLURM_CPUS_ON_NODE may count cores where the set holds their hyperthreads.
        sharers = ranks if tasks else ranks * (cpu.slurm_tasks_on_node or 1)
        cap = max(1, on_node // sharers)
        if cap < budget:
            budget = cap
            notes.append(
                f"SLURM_CPUS_ON_NODE={on_node} shared by {_count(sharers, 'rank')}, which"
                f" nothing confines: {cap} each"
            )
    per_task = cpu.slurm_cpus_per_task
    if per_task is not None:
        # Ranks that are srun tasks each got the amount; otherwise one task holds them all.
        cap = per_task if tasks else max(1, per_task // ranks)
        if cap < budget:
            budget = cap
            whose = "per rank" if tasks else f"shared by {ranks} ranks of one task"
            notes.append(f"SLURM_CPUS_PER_TASK={per_task} {whose}: {cap} each")
    return budget


def _at(gpu_cpus: Sequence[frozenset[int] | None], index: int) -> frozenset[int] | None:
    return gpu_cpus[index] if index < len(gpu_cpus) else None


def _near(
    affinity: frozenset[int], gpu_cpus: Sequence[frozenset[int] | None], ranks: int
) -> tuple[frozenset[int] | None, ...]:
    # None where a rank's GPU is unknown or its near CPUs are all outside the affinity.
    return tuple((_at(gpu_cpus, i) or frozenset()) & affinity or None for i in range(ranks))


def _place(
    cpu: CpuFacts,
    *,
    mode: str,
    own: bool,
    near: tuple[frozenset[int] | None, ...],
    local_rank: int,
    notes: list[str],
) -> tuple[str, frozenset[int]]:
    if mode == "off":
        notes.append("pinning off: affinity left as is")
        return "off", cpu.affinity
    kept = _kept_reason(cpu)
    if mode == "auto" and kept:
        notes.append(kept)
        return "kept", cpu.affinity
    if kept:
        notes.append(f"mode={mode} asked: re-pinning within the existing binding ({kept})")
    if mode == "node":
        return "node", near[local_rank] or cpu.affinity
    if mode == "auto" and cpu.quota is not None and cpu.quota < len(cpu.affinity):
        notes.append(
            f"only a cgroup quota ({cpu.quota:g} CPUs) limits {len(cpu.affinity)} CPUs: "
            "node mode, no exclusive slices of a shared pool"
        )
        return "node", near[local_rank] or cpu.affinity
    if own:
        # A group of one: this rank's exclusive slice is all it may use near its GPU.
        return "exclusive", near[local_rank] or cpu.affinity
    slices, why = _exclusive_slices(cpu, near)
    if slices is None:
        notes.append(f"no exclusive slices ({why}): node mode")
        return "node", near[local_rank] or cpu.affinity
    return "exclusive", slices[local_rank]


def _kept_reason(cpu: CpuFacts) -> str | None:
    if _srun_bound(cpu):
        return f"kept srun --cpu-bind binding ({cpu.slurm_cpu_bind})"
    if cpu.online and cpu.affinity < cpu.online:
        return (
            f"kept affinity {format_cpulist(cpu.affinity)}, narrower than the "
            f"{len(cpu.online)} online CPUs (cpuset, taskset, numactl or torchrun --numa-binding)"
        )
    return None


def _exclusive_slices(
    cpu: CpuFacts, near: tuple[frozenset[int] | None, ...]
) -> tuple[tuple[frozenset[int], ...] | None, str]:
    """Every local rank's slice, or None and why it cannot be done."""
    pools = [n for n in near if n is not None]
    groups: dict[frozenset[int], list[int]] = {}
    if not pools:
        groups[cpu.affinity] = list(range(len(near)))
    elif len(pools) < len(near):
        return None, "CPUs near the GPU known for only some local ranks"
    else:
        for rank, pool in enumerate(pools):
            groups.setdefault(pool, []).append(rank)
        distinct = list(groups)
        if any(a & b for i, a in enumerate(distinct) for b in distinct[i + 1 :]):
            return None, "CPU sets near the GPUs overlap without being equal"
    slices: dict[int, frozenset[int]] = {}
    for pool, members in groups.items():
        units = _units(pool, cpu.cores)
        if len(units) < len(members):
            return None, (
                f"{_count(len(units), 'core')} in {format_cpulist(pool)} "
                f"for {_count(len(members), 'local rank')}"
            )
        base, extra = divmod(len(units), len(members))
        for index, rank in enumerate(members):
            start = index * base + min(index, extra)
            count = base + (1 if index < extra else 0)
            slices[rank] = frozenset().union(*units[start : start + count])
    return tuple(slices[rank] for rank in range(len(near))), ""


def _units(pool: frozenset[int], cores: tuple[frozenset[int], ...]) -> list[frozenset[int]]:
    # A CPU whose core is unknown counts as a core of its own.
    core_of = {c: core for core in cores for c in core}
    units: dict[frozenset[int], None] = {}
    for c in sorted(pool):
        units.setdefault(core_of.get(c, frozenset({c})) & pool, None)
    return list(units)


def _size(
    budget: int,
    num_threads: int | None,
    num_workers: int | None,
    notes: list[str],
    max_workers: int | None = None,
) -> tuple[int, int]:
    # The main process's CPUs. A budget of 2 keeps none: one worker beside it decodes on one
    # CPU, as the main process would alone, plus the hand-off through shared memory (measured
    # slower than no worker at all), so two workers share its CPU; it waits on them when input
    # is the limit.
    reserve = 0 if budget == 2 else 1 if budget < 4 else 2
    if num_workers is None:
        left = budget - (num_threads if num_threads is not None else reserve)
        workers = max(0, min(left, MAX_WORKERS))
        if max_workers is not None and workers > max_workers:
            notes.append(f"workers capped at {max_workers} (room in /dev/shm)")
            workers = max_workers
    else:
        workers = num_workers
        notes.append(f"num_workers={num_workers} set explicitly")
    if num_threads is None:
        threads = max(1, budget - workers)
    else:
        threads = num_threads
        notes.append(f"num_threads={num_threads} set explicitly")
    if threads + workers > budget and (num_threads is not None or num_workers is not None):
        notes.append(f"{threads} threads + {workers} workers exceed the budget of {budget} CPUs")
    return threads, workers


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def for_command(plan: CpuPlan, *, threads_set: bool) -> CpuPlan:
    """The plan for a command trainbox hands over to: its whole budget as threads, unless the
    config set a thread count.

    `trainbox run` keeps CPUs for the DataLoader workers it starts, but a script of the user's
    starts its own, if any, knowing nothing of that reserve: under `exec` it ran with half the
    threads plain python gives it. The worker count is still exported for the script to read.
    """
    if threads_set or plan.num_threads >= plan.budget:
        return plan
    return dataclasses.replace(
        plan,
        num_threads=plan.budget,
        notes=(*plan.notes, f"all {plan.budget} CPUs of the budget as threads: the command's own"),
    )


def with_workers(plan: CpuPlan, workers: int, *, reason: str, grow_threads: bool) -> CpuPlan:
    """The plan with fewer DataLoader workers; their CPUs go to threads unless those were set."""
    if workers >= plan.num_workers:
        return plan
    freed = plan.num_workers - workers
    # Up to the budget: a budget of 2 runs 2 workers beside 1 thread, one CPU shared.
    grown = max(plan.num_threads, min(plan.num_threads + freed, plan.budget))
    return dataclasses.replace(
        plan,
        num_workers=workers,
        num_threads=grown if grow_threads else plan.num_threads,
        notes=(*plan.notes, f"{_count(workers, 'worker')} because {reason}"),
    )


def describe(cpu_plan: CpuPlan) -> dict[str, object]:
    """The plan as plain JSON-able data for `trainbox doctor` and the rank's log line."""
    return {
        "cpus": sorted(cpu_plan.cpus),
        "num_threads": cpu_plan.num_threads,
        "num_workers": cpu_plan.num_workers,
        "mode": cpu_plan.mode,
        "budget": cpu_plan.budget,
        "notes": list(cpu_plan.notes),
    }
