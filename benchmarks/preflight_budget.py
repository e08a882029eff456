"""Preflight's cost on a healthy 8-GPU node (simulated NVML): survey, detection, judgement, plan.

    .venv/bin/python benchmarks/preflight_budget.py            # 50 repetitions
    .venv/bin/python benchmarks/preflight_budget.py --quick    # 5, as CI runs it

The budget is 300 ms per node. NVML answers come from tests/fakenvml.py, so this measures
trainbox's own work; a real driver adds its call latency (docs/preflight.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from trainbox import config
from trainbox.preflight import node as preflight_node
from trainbox.process import bootstrap

import fakenvml

BUDGET_MS = 300.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 repetitions (CI)")
    args = parser.parse_args()
    node = fakenvml.healthy_node()
    sys.modules["pynvml"] = fakenvml.fake_pynvml(node)
    os.cpu_count = lambda: node.cpu_count  # masks sized as on the simulated 96-CPU host
    # Rank 0 of 8 torchrun workers on the node, as each worker would run it.
    env = {
        "TORCHELASTIC_RUN_ID": "bench", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }  # fmt: skip
    settings = config.load(None, [])
    times = []
    for _ in range(5 if args.quick else 50):
        started = time.perf_counter()
        prepared = bootstrap.startup_facts(env, settings)
        times.append((time.perf_counter() - started) * 1000)
    median = statistics.median(times)
    share = median / BUDGET_MS
    print(
        f"preflight on a healthy 8-GPU node: median {median:.1f} ms, max {max(times):.1f} ms"
        f" over {len(times)} runs; budget {BUDGET_MS:.0f} ms ({share:.1%} of it)"
    )
    print(f"checks: {len(prepared.preflight.checks)}, fatal: {len(prepared.preflight.fatal)}")
    # The fabric's share: this node's real sysfs and one dlopen, as every rank reads them.
    fabric = []
    for _ in range(len(times)):
        started = time.perf_counter()
        preflight_node.read_fabric(env)
        fabric.append((time.perf_counter() - started) * 1000)
    print(
        f"of which the fabric read: median {statistics.median(fabric):.2f} ms,"
        f" max {max(fabric):.2f} ms"
    )
    return 0 if median < BUDGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
