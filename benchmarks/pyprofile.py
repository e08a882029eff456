"""Where a training process's time goes, by Python function, with nothing patched.

    python -m torch.distributed.run --standalone --nproc-per-node=1 \
        benchmarks/pyprofile.py OUT.json SKIP STEPS -m trainbox run ...   # or: SCRIPT ARGS

The instrument of step_pieces.py. It runs any training program (`-m MODULE ARGS`, or SCRIPT
ARGS) with torch.profiler's Python tracer (`with_stack=True`) on in rank 0. The profiler steps on
every optimizer step through torch's public global hook (`register_optimizer_step_post_hook`),
so trainbox and a hand-written loop are cut at the same points, and nothing of either program is
replaced or wrapped: it needs no name inside trainbox. After SKIP optimizer steps (and 5 more of
profiler warm-up) it records STEPS steps, then turns itself off; OUT gets `summarize`'s record.
PYPROFILE_KEEP=PATH also keeps the whole trace there (chrome://tracing or Perfetto reads it).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import runpy
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

WARMUP = 5  # profiler warm-up steps after SKIP, not recorded
# The annotations torch.optim puts around its calls (record_function), counted as pieces.
ANNOTATED = {"Optimizer.step#": "optimizer step", "Optimizer.zero_grad#": "zero_grad"}
# Torch functions both loops call, and the piece each one's inclusive time is shown as. Matched
# on the function's key (see `key`); torch's public entry points, never a trainbox name.
LANDMARKS = {
    "torch/utils/data/dataloader.py:__next__": "next batch (DataLoader)",
    "torch/nn/parallel/distributed.py:forward": "DDP forward",
    "torch/nn/functional.py:cross_entropy": "cross_entropy",
    "torch/_tensor.py:backward": "backward (with the gradient all-reduce's wait)",
}
# Where a function lives -> who its time is booked to (first match wins).
OWNERS = [
    ("trainbox/", "trainbox"),
    ("benchmarks/", "the benchmark's own code (raw_ddp.py, benchtask.py)"),
    ("torch/nn/parallel/", "torch DDP"),
    ("torch/autograd/profiler", "torch profiler (its hooks, both sides)"),
    ("torch/profiler/", "torch profiler (its hooks, both sides)"),
    ("torch/nn/", "torch.nn (modules, functional)"),
    ("torch/optim/", "torch.optim"),
    ("torch/autograd/", "torch.autograd (backward)"),
    ("torch/_tensor.py", "torch.autograd (backward)"),
    ("torch/utils/data/", "torch DataLoader"),
    ("torch/distributed/", "torch.distributed"),
    ("torch/", "torch, other"),
]
OTHER = "Python's library and other packages"
_NAME = re.compile(r"^(?P<path>.*)\((?P<line>\d+)\): (?P<func>.*)$")


def key(name: str) -> str:
    """`path:function` of a traced Python function, the path from its package root.

    The tracer names functions `PATH(LINE): NAME`; the line is dropped (it moves with every edit).
    """
    found = _NAME.match(name)
    if found is None:
        return name
    path = found["path"]
    for root in ("site-packages/", "/src/", "/work/main/"):
        if root in path:
            path = path.split(root, 1)[1]
            break
    if "/benchmarks/" in path:
        path = "benchmarks/" + path.split("/benchmarks/", 1)[1]
    return f"{path}:{found['func']}"


def owner(function: str) -> str:
    """Who a function's time is booked to, by where it lives."""
    for prefix, who in OWNERS:
        if function.startswith(prefix):
            return who
    return OTHER


def summarize(trace: Mapping[str, Any], main_tid: int) -> dict[str, Any]:
    """Per-step figures of a chrome trace made with the Python tracer on.

    `self_ns` per function: its time less that of the Python functions it called; a built-in's
    time (a C function called from Python, torch's ops among them) is booked to its caller.
    `inclusive_ns` per landmark and annotated piece: the outermost call's whole time. `owners`
    sums self time by who owns the function. Main thread only; `other_threads_ns` is the self time
    of every other Python thread's Python code (what it took of the GIL), C calls left out.
    """
    steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("the trace recorded no step")
    # Calls open when the trace began or ended (the program's main function, the optimizer step
    # whose hook ended the trace) count only for their time inside the recorded steps.
    begin, end = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    events = [
        {**e, "dur_full": e["dur"],
         "dur": max(0.0, min(e["ts"] + e["dur"], end) - max(e["ts"], begin))}
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and "dur" in e
    ]  # fmt: skip
    python = [e for e in events if e.get("cat") == "python_function"]
    by_id = {e["args"]["Python id"]: e for e in python}
    children: dict[int, list[int]] = {}
    for e in python:
        parent = e["args"].get("Python parent id")
        if parent in by_id:
            children.setdefault(parent, []).append(e["args"]["Python id"])
    self_ns: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    other_threads, other_calls = 0.0, 0
    roots = [i for i, e in by_id.items() if e["args"].get("Python parent id") not in by_id]
    # Depth first, with the functions open on the stack (keyed, to count recursion once) and
    # the nearest caller that is not a built-in (which a built-in's self time goes to).
    stack: list[tuple[bool, int, str]] = [(False, i, "") for i in roots]
    open_keys: Counter[str] = Counter()
    while stack:
        leaving, node, caller = stack.pop()
        if leaving:  # the node's calls are done: its key (in `caller`) is no longer open
            open_keys[caller] -= 1
            continue
        e = by_id[node]
        name = key(e["name"])
        builtin = name.startswith("<built-in")
        kids = children.get(node, [])
        own = e["dur"] - sum(by_id[k]["dur"] for k in kids)
        booked = caller if builtin and caller else name
        if e["tid"] != main_tid:
            # Another thread's C calls are mostly waits (sleeps, locks, a collective's wait):
            # only its Python code counts, what it takes of the GIL.
            # A call open when the trace began or ended is the thread's loop, waiting.
            whole = begin < e["ts"] and e["ts"] + e["dur_full"] < end and not builtin
            other_threads += own if whole else 0.0
            other_calls += 1 if whole else 0
        else:
            self_ns[booked] += own
            if not builtin:
                calls[name] += 1
            if name in LANDMARKS and open_keys[name] == 0:
                inclusive[LANDMARKS[name]] += e["dur"]
        open_keys[name] += 1
        stack.append((True, node, name))
        stack.extend((False, k, booked) for k in kids)
    for e in events:
        if e.get("cat") != "user_annotation" or e["tid"] != main_tid:
            continue
        for prefix, piece in ANNOTATED.items():
            if str(e["name"]).startswith(prefix):
                inclusive[piece] += e["dur"]
    n = len(steps)
    owners: Counter[str] = Counter()
    for function, us in self_ns.items():
        owners[owner(function)] += us
    per_step = 1e3 / n  # trace times are µs; the record keeps ns per step
    return {
        "steps": len(steps),
        "step_ns": sum(e["dur"] for e in steps) * per_step,
        "python_calls_per_step": sum(calls.values()) / n,
        "self_ns": {k: v * per_step for k, v in self_ns.most_common()},
        "calls_per_step": {k: v / n for k, v in calls.items()},
        "inclusive_ns": {k: v * per_step for k, v in inclusive.items()},
        "owners_ns": {k: v * per_step for k, v in owners.most_common()},
        "other_threads_ns": other_threads * per_step,
        "other_threads_calls_per_step": other_calls / n,
    }


def wrap(out: Path, skip: int, steps: int, target: list[str]) -> None:
    """Run `target` (-m MODULE ARGS, or SCRIPT ARGS) with rank 0 profiled."""
    if os.environ.get("RANK", "0") == "0":
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.profiler import ProfilerActivity, profile, schedule

        def ready(prof: Any) -> None:
            with tempfile.TemporaryDirectory() as tmp:
                trace = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(trace))
                if os.environ.get("PYPROFILE_KEEP"):
                    shutil.copy(trace, os.environ["PYPROFILE_KEEP"])
                record = summarize(json.loads(trace.read_text()), main_tid=os.getpid())
            out.write_text(json.dumps(record))

        plan = schedule(wait=skip, warmup=WARMUP, active=steps, repeat=1)
        profiler = profile(
            activities=[ProfilerActivity.CPU], schedule=plan, with_stack=True, on_trace_ready=ready
        )
        profiler.start()
        register_optimizer_step_post_hook(lambda *_: profiler.step())
        # A program that ends before the last recorded step still gets what was recorded.
        atexit.register(lambda: None if out.exists() else profiler.stop())
    if target[0] == "-m":
        sys.argv = target[1:]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = target
        runpy.run_path(target[0], run_name="__main__")


def top(records: Mapping[str, Iterable[Mapping[str, float]]], *, rows: int) -> list[str]:
    """The functions with the most self time (median over a side's runs) on any side."""
    best: Counter[str] = Counter()
    for runs in records.values():
        runs = list(runs)
        for function in {f for record in runs for f in record}:
            typical = statistics.median(record.get(function, 0.0) for record in runs)
            best[function] = max(best[function], typical)
    return [function for function, _ in best.most_common(rows)]


if __name__ == "__main__":
    wrap(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
