"""CPU pinning and thread sizing for a local rank: read facts, plan purely, apply early.

Importing this package does not import torch, so a rank can pin itself before torch starts its
thread pools.
"""

from __future__ import annotations

from trainbox.affinity.apply import WORKERS_VAR, Applied, apply, set_torch_threads, worker_init
from trainbox.affinity.facts import CpuFacts, format_cpulist, parse_cpulist, read
from trainbox.affinity.plan import MODES, CpuPlan, for_command, plan, with_workers

__all__ = [
    "MODES",
    "WORKERS_VAR",
    "Applied",
    "CpuFacts",
    "CpuPlan",
    "apply",
    "describe",
    "for_command",
    "format_cpulist",
    "parse_cpulist",
    "plan",
    "read",
    "set_torch_threads",
    "with_workers",
    "worker_init",
]


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
