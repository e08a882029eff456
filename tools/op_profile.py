"""Diagnosis, not a benchmark: torch.profiler (CPU) over optimizer steps 500-699 of rank 0.

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node=2 \
        tools/op_profile.py /tmp/tb.json -m trainbox run ...      # or: ... SCRIPT ARGS
    .venv/bin/python tools/op_profile.py --diff /tmp/tb.json /tmp/raw.json

It wraps any training program: the profiler steps on every optimizer step (a global
optimizer hook), so trainbox and the raw loop are cut the same way. OUT gets, per op, its
calls and self CPU µs; --diff prints the ops whose calls per step differ between two runs.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule

STEPS = 200  # steps profiled, after 500 skipped and 20 warm-up ones


def wrap(out: Path, target: list[str]) -> None:
    """Run `target` (-m MODULE ARGS, or SCRIPT ARGS) with rank 0 profiled."""
    if os.environ.get("RANK", "0") == "0":
        plan = schedule(wait=500, warmup=20, active=STEPS, repeat=1)
        profiler = profile(activities=[ProfilerActivity.CPU], schedule=plan)
        profiler.__enter__()
        register_optimizer_step_post_hook(lambda *_: profiler.step())

        def dump() -> None:
            profiler.__exit__(None, None, None)
            ops = {e.key: [e.count, e.self_cpu_time_total] for e in profiler.key_averages()}
            out.write_text(json.dumps(ops))

        atexit.register(dump)
    if target[0] == "-m":
        sys.argv = target[1:]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = target
        runpy.run_path(target[0], run_name="__main__")


def diff(one: Path, other: Path) -> None:
    """Ops whose calls per step differ, with their self CPU µs per step on each side."""
    a, b = json.loads(one.read_text()), json.loads(other.read_text())
    print(f"{'op':58} {'calls/step':>10} {'other':>7} {'self us/step':>12} {'other':>7}")
    for key in sorted(set(a) | set(b)):
        (calls_a, us_a), (calls_b, us_b) = a.get(key, [0, 0]), b.get(key, [0, 0])
        if calls_a != calls_b:
            print(
                f"{key[:58]:58} {calls_a / STEPS:10.2f} {calls_b / STEPS:7.2f}"
                f" {us_a / STEPS:12.1f} {us_b / STEPS:7.1f}"
            )


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        diff(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        wrap(Path(sys.argv[1]), sys.argv[2:])
