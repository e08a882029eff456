"""Every preflight check, declared once: its name, its scope, whether it is fatal by default and
whose fault a failure is (the node's, the user's setting, or the object store's).

The schema (preflight.fatal's default and the names it accepts) and preflight's report (who logs
a warning, which exit code) read this table; preflight/checks.py judges. It lives in config, the
lower layer, so the schema can read it without importing preflight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Who shares a check's finding. node: every rank of a node finds the same (the driver, torch's
# build, /dev/shm, run_dir, the master address, the fabric, the store), so local rank 0 alone
# logs it. rank: the finding is about the GPUs this process sees, and under
# srun --gpus-per-task each rank sees others. No check is the whole job's: run_dir, the store and
# the master address are each seen through one node's mounts, credentials and DNS.
Scope = Literal["node", "rank"]
# Whose fault a failure is. node: the node's, so it is recorded as a bad node. config: the user's
# own setting, a usage error (exit 2) when alone. store: the object store's (down, or refusing
# our credentials), which no other node would do better with, so no bad-node record is written.
Culprit = Literal["node", "config", "store"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckSpec:
    """One preflight check as the schema and the report know it."""

    # Stable name: what judge() emits and preflight.fatal lists.
    name: str
    # Whose fault a failure is (see Culprit).
    culprit: Culprit = "node"
    # Who shares its finding (see Scope).
    scope: Scope
    # Whether a `fail` stops the run by default; otherwise it only warns.
    fatal: bool


# In the order judge() emits them, which is also the order of preflight.fatal's default.
CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec(name="driver", scope="node", fatal=True),
    CheckSpec(name="cuda_version", scope="node", fatal=True),
    CheckSpec(name="gpu_count", scope="rank", fatal=True),
    CheckSpec(name="gpu_visibility", scope="rank", fatal=True),
    CheckSpec(name="gpu_lost", scope="rank", fatal=True),
    CheckSpec(name="memory", scope="rank", fatal=False),
    CheckSpec(name="ecc", scope="rank", fatal=True),
    CheckSpec(name="recovery_action", scope="rank", fatal=True),
    CheckSpec(name="row_remap", scope="rank", fatal=True),
    CheckSpec(name="retired_pages", scope="rank", fatal=True),
    CheckSpec(name="clocks", scope="rank", fatal=False),
    CheckSpec(name="temperature", scope="rank", fatal=False),
    CheckSpec(name="pcie_link", scope="rank", fatal=False),
    CheckSpec(name="mig", scope="rank", fatal=True),
    CheckSpec(name="compute_mode", scope="rank", fatal=True),
    CheckSpec(name="gpu_processes", scope="rank", fatal=True),
    CheckSpec(name="persistence", scope="rank", fatal=False),
    CheckSpec(name="shm", scope="node", fatal=True),
    CheckSpec(name="run_dir", scope="node", fatal=True, culprit="config"),
    CheckSpec(name="disk_space", scope="node", fatal=True),
    CheckSpec(name="master_address", scope="node", fatal=True),
    CheckSpec(name="storage", scope="node", fatal=True, culprit="store"),
    # A socket fall-back is slow, not broken: fatal only when preflight.fatal lists it.
    CheckSpec(name="fabric", scope="node", fatal=False),
)

# Every name preflight.fatal accepts.
CHECK_NAMES = tuple(check.name for check in CHECKS)
# preflight.fatal's default.
FATAL_CHECKS = tuple(check.name for check in CHECKS if check.fatal)
# Findings every rank of a node shares: one warning per node is enough.
NODE_WIDE = frozenset(check.name for check in CHECKS if check.scope == "node")
# Findings about the user's own settings rather than the node.
CONFIG_CHECKS = frozenset(check.name for check in CHECKS if check.culprit == "config")
# Findings about the object store, not the node: never a bad-node record.
STORE_CHECKS = frozenset(check.name for check in CHECKS if check.culprit == "store")
