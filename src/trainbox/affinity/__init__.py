"""CPU pinning and thread sizing for a local rank: read facts, plan purely, apply early.

Importing this package does not import torch, so a rank can pin itself before torch starts its
thread pools.
"""

from __future__ import annotations

from trainbox.affinity.apply import WORKERS_VAR, Applied, apply, set_torch_threads, worker_init
from trainbox.affinity.facts import CpuFacts, format_cpulist, parse_cpulist, read
from trainbox.affinity.plan import MODES, CpuPlan, describe, for_command, plan, with_workers

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
