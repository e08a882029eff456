"""Run every benchmark, one after another, and check that each worked.

    .venv/bin/python benchmarks/run_all.py --quick     # short runs, no targets judged (CI: one
                                                       # test per benchmark, test_benchmarks_run)
    .venv/bin/python benchmarks/run_all.py --save      # full runs, results to benchmarks/results/

Each benchmark runs as its own process (`benchmarks/NAME.py`); it must exit 0 and end with a
JSON line whose numbers are sane (finite, measured times positive). Quick mode judges no
performance target: timings on a shared CI machine are too noisy for that. Exit 1 if any
benchmark failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Cheapest first, so a broken set-up shows early.
BENCHMARKS = (
    "preflight_budget",
    "per_rank_costs",
    "sink_cost",
    "object_store_clients",
    "object_store_upload",
    "exec_overhead",
    "exit_abort",
    "step_overhead",
    "step_pieces",
    "first_step",
    "trainer_overhead",
    "health_cost",
    "scaling",
    "many_ranks",
    "goodput",
    "data_pinning",
    "input_pipeline",
    "stream_pipeline",
    "stream_parity",
    "checkpoint_cost",
    "fsdp_memory",
    "hsdp_traffic",
    "record_crc",
    "store_load",
)


def main() -> int:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--quick", action="store_true", help="short runs, as CI runs them")
    parse.add_argument("--save", action="store_true", help="write benchmarks/results/NAME.json")
    parse.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(BENCHMARKS)}")
    args = parse.parse_args()
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parse.error(f"unknown benchmark(s): {', '.join(unknown)}")
    flags = [*(["--quick"] if args.quick else []), *(["--save"] if args.save else [])]
    failed = []
    durations = {}
    started_all = time.perf_counter()
    for name in args.names or BENCHMARKS:
        print(f"== {name} {' '.join(flags)}", flush=True)
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(HERE / f"{name}.py"), *flags],
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        durations[name] = time.perf_counter() - started
        print(proc.stdout, end="", flush=True)
        problem = _problem(name, proc)
        if problem:
            failed.append(name)
            print(f"!! {name}: {problem}", flush=True)
        print(f"== {name}: {durations[name]:.0f} s", flush=True)
    total = time.perf_counter() - started_all
    shown = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in durations.items())
    print(f"\n{len(durations) - len(failed)}/{len(durations)} benchmarks ran in {total:.0f} s"
          f" ({shown})")  # fmt: skip
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def _problem(name: str, proc: subprocess.CompletedProcess[str]) -> str:
    if proc.returncode != 0:
        return f"exited {proc.returncode}"
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        record = json.loads(last)
    except json.JSONDecodeError:
        return "its last line is not the JSON result"
    if record.get("benchmark") != name or record.get("sane") is not True:
        return "its JSON result is missing or not sane"
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
