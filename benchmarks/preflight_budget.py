"""Preflight's cost on a healthy 8-GPU node (simulated NVML): survey, detection, judgement, plan.

    .venv/bin/python benchmarks/preflight_budget.py            # 50 repetitions
    .venv/bin/python benchmarks/preflight_budget.py --quick    # 5, as CI runs it

The budget is 300 ms per node. NVML answers come from tests/fakenvml.py, so this measures
trainbox's own work; a real driver adds its call latency (docs/preflight.md). Unlike the other
benchmarks, the exit code also judges the budget (1: over it), in quick runs too.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import harness

from trainbox import config
from trainbox.preflight import node as preflight_node
from trainbox.process import bootstrap

import fakenvml

BUDGET_MS = 300.0


def main() -> int:
    bench = harness.start("preflight_budget", harness.parser(__doc__).parse_args(),
                          reps=50, quick_reps=5)  # fmt: skip
    node = fakenvml.healthy_node()
    # NVML's answers, and masks sized as on the simulated 96-CPU host; the JSON line's machine
    # is this one.
    with (
        mock.patch.dict(sys.modules, {"pynvml": fakenvml.fake_pynvml(node)}),
        mock.patch.object(os, "cpu_count", return_value=node.cpu_count),
    ):
        times, fabric, prepared = measure(bench.reps)
    median = harness.median(times)
    share = median / BUDGET_MS
    print(
        f"preflight on a healthy 8-GPU node: median {median:.1f} ms, max {max(times):.1f} ms"
        f" over {len(times)} runs; budget {BUDGET_MS:.0f} ms ({share:.1%} of it)"
    )
    print(f"checks: {len(prepared.preflight.checks)}, fatal: {len(prepared.preflight.fatal)}")
    print(
        f"of which the fabric read: median {harness.median(fabric):.2f} ms,"
        f" max {max(fabric):.2f} ms"
    )
    code = bench.finish(
        {"settings": {"reps": bench.reps, "budget_ms": BUDGET_MS}, "startup_ms": times,
         "median_ms": median, "budget_share": share, "fabric_ms": fabric},
        positive=[*times, *fabric],
    )  # fmt: skip
    return code or (0 if median < BUDGET_MS else 1)


def measure(reps: int) -> tuple[list[float], list[float], bootstrap.StartupFacts]:
    """ms of `reps` preparations and of `reps` fabric reads, and the last preparation."""
    # Rank 0 of 8 torchrun workers on the node, as each worker would run it.
    env = {
        "TORCHELASTIC_RUN_ID": "bench", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }  # fmt: skip
    settings = config.load(None, [])
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        prepared = bootstrap.startup_facts(env, settings)
        times.append((time.perf_counter() - started) * 1000)
    # The fabric's share: this node's real sysfs and one dlopen, as every rank reads them.
    fabric = []
    for _ in range(reps):
        started = time.perf_counter()
        preflight_node.read_fabric(env)
        fabric.append((time.perf_counter() - started) * 1000)
    return times, fabric, prepared


if __name__ == "__main__":
    raise SystemExit(main())
