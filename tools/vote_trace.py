"""Diagnosis, not a benchmark: `trainbox ARGS` with the stop vote traced, to see why the loop waits.

    TRACE_OUT=/tmp/vote .venv/bin/python -m torch.distributed.run --standalone \
        --nproc-per-node=2 --no-python .venv/bin/python tools/vote_trace.py run ...
    .venv/bin/python tools/vote_trace.py --summary /tmp/vote

Each rank writes TRACE_OUT.RANK.json: every vote's all-reduce latency (sample to outcome), the
wall time it entered the all-reduce (the ranks' skew), how far past `every_s` its thread woke,
and every `after_step` that took over 20 us (the loop waiting for a vote in flight). LEAD=N
overrides the vote's look-ahead, SWITCH=S sets sys.setswitchinterval (the GIL's hand-off).
The numbers in benchmarks/README.md ("Why the loop waits") come from it.

Unlike everything in benchmarks/, it replaces trainbox internals by name (StopVote's methods
in trainbox.train.watch.control): it fits the loop as it was when those numbers were taken and stops
with an AttributeError once those names change. CI does not run it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# An after_step slower than this waited for the vote (its time alone: benchmarks/README.md).
WAITED_S = 20e-6


def install(out: str) -> None:
    """Wrap the vote's all-reduce, after_step and its timed waits; dump the record at exit."""
    from trainbox.train.watch import control

    if os.environ.get("LEAD"):
        control.LEAD = int(os.environ["LEAD"])
    record: dict[str, Any] = {"latency": [], "enter": [], "wake": [], "waits": [], "steps": 0}
    all_reduce, after_step = control.StopVote._all_reduce, control.StopVote.after_step
    wait_for = threading.Condition.wait_for

    def traced_all_reduce(self: control.StopVote, wish: list[int]) -> list[int]:
        record["enter"].append(time.time())
        began = time.perf_counter()
        reduced = all_reduce(self, wish)
        record["latency"].append(time.perf_counter() - began)
        return reduced

    def traced_after_step(self: control.StopVote, step: int) -> str | None:
        began = time.perf_counter()
        reason = after_step(self, step)
        took = time.perf_counter() - began
        record["steps"] += 1
        if took > WAITED_S:
            record["waits"].append(took)
        return reason

    def traced_wait_for(self: Any, predicate: Any, timeout: float | None = None) -> Any:
        if threading.current_thread().name != "trainbox-stop-vote" or timeout is None:
            return wait_for(self, predicate, timeout)
        began = time.perf_counter()
        result = wait_for(self, predicate, timeout)
        record["wake"].append(time.perf_counter() - began - timeout)
        return result

    control.StopVote._all_reduce = traced_all_reduce  # type: ignore[method-assign]
    control.StopVote.after_step = traced_after_step  # type: ignore[method-assign]
    threading.Condition.wait_for = traced_wait_for  # type: ignore[method-assign]
    rank = os.environ.get("RANK", "0")
    atexit.register(lambda: Path(f"{out}.{rank}.json").write_text(json.dumps(record)))


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "-"
    at = [ordered[int(q * (len(ordered) - 1))] * 1e6 for q in (0.5, 0.9, 1.0)]
    return "/".join(f"{v:.0f}" for v in at)


def summary(out: str) -> None:
    """Per rank: vote latency, wake overshoot, loop waits (us, p50/p90/max); the ranks' skew."""
    ranks = [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in (0, 1)]
    for rank, record in enumerate(ranks):
        waits = record["waits"]
        print(
            f"rank {rank}: {len(record['latency'])} votes, latency {percentiles(record['latency'])}"
            f" us, wake overshoot {percentiles(record['wake'])} us; the loop waited after"
            f" {len(waits)} of {record['steps']} steps ({percentiles(waits)} us),"
            f" {sum(waits) / max(record['steps'], 1) * 1e6:.1f} us per step on average"
        )
    skew = [abs(a - b) for a, b in zip(ranks[0]["enter"], ranks[1]["enter"], strict=False)]
    print(f"entry skew between the ranks: {percentiles(skew)} us")


def main() -> int:
    if sys.argv[1:2] == ["--summary"]:
        summary(sys.argv[2])
        return 0
    if os.environ.get("SWITCH"):
        sys.setswitchinterval(float(os.environ["SWITCH"]))
    install(os.environ["TRACE_OUT"])
    from trainbox import cli

    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
