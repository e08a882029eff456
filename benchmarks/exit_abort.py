"""Exit aborts: how often a 2-rank gloo DDP job dies at exit with SIGABRT, per setup.

    .venv/bin/python benchmarks/exit_abort.py [--quick] [--reps N] [--setups A,B,...]
        [--switch-interval S] [--save]

Each run starts examples/own_script.py as two ranks the way `trainbox exec` leaves them under
srun or mpirun: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT (a free port) exported,
each rank pinned to its own CPU (as exec's CPU plan pins it), OMP_NUM_THREADS=1, no torchrun
agent, so rank 0's `init_process_group("env://")` hosts the TCPStore. A run aborts when a rank
exits with SIGABRT or prints "terminate called without an active exception".

The race is rare on a quiet machine, so every rank runs with Python's GIL switch interval
raised to `--switch-interval` (0.5 s; 0 keeps Python's 5 ms): the gloo thread then waits longer
for the GIL, which widens the window without changing the mechanism. How often each setup
aborted, with and without it: benchmarks/README.md ("Exit aborts", "Figures from code comments").

The cause (gdb on the core): a gloo worker thread (`ProcessGroupGloo::runLoop`) drops the last
reference to the job's last collective (an `AsyncBarrierWork` holding the prior all_reduce's
tensors) after `barrier()` has returned. Freeing a tensor that has a Python object needs the
GIL; if the main thread has started `Py_FinalizeEx` by then, Python 3.11's `take_gil` calls
`pthread_exit`, whose forced unwind crosses the noexcept work destructor: `std::terminate`.
The group outlives `destroy_process_group()` because DDP's reducer still holds it (DDP is freed
by the collector only inside finalization), so its worker threads are never joined in time.
The store is not involved.

Setups (alternated run by run, so load hits every setup alike):
  plain        the script as users write it (own_script.py without its `del ddp` and
               `gc.collect()` before destroy_process_group), as exec left it before its
               exit hook
  no-libuv     plain, with USE_LIBUV=0 (the store's older server)
  agent-store  plain, the store hosted by this (parent) process, every rank a client
               through TORCHELASTIC_USE_AGENT_STORE=True
  exit-grace   plain, with what `trainbox exec` exports (trainbox.process.exit_grace): a
               sitecustomize first on PYTHONPATH whose exit hook sleeps dist.exit_grace_s
               (0.1 s) while the interpreter is still whole: the GIL is free, the gloo
               thread that waits for it finishes freeing the work, then Python finalizes.
               A hook that only runs gc.collect() did not help (benchmarks/README.md has
               the counts): it never releases the GIL.
  user-fix     examples/own_script.py unchanged: `del ddp, optimizer; gc.collect()` before
               `destroy_process_group()` (the workaround for users' scripts)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import harness

from trainbox.process import exit_grace

SCRIPT = harness.ROOT / "examples" / "own_script.py"
SETUPS = ("plain", "no-libuv", "agent-store", "exit-grace", "user-fix")
# CI checks that the benchmark works: before and after, once each.
QUICK_SETUPS = ("plain", "exit-grace")
REPS, QUICK_REPS = 20, 1
# A run that takes longer has hung (a normal run's time: benchmarks/README.md).
RUN_TIMEOUT_S = 120.0
# dist.exit_grace_s's default.
GRACE_S = 0.1
ABORT_TEXT = "terminate called without an active exception"
# The user-side workaround's lines in own_script.py; "plain" is the script without them.
_WORKAROUND = re.compile(r"^\s*(del ddp, optimizer|gc\.collect\(\))\n", re.MULTILINE)


@dataclass
class Tally:
    """One setup's outcomes."""

    runs: int = 0
    aborts: int = 0
    aborted_ranks: list[int] = field(default_factory=list)
    other_failures: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def prepare(work: Path, switch_interval: float) -> dict[str, Path]:
    """The scripts, and the sitecustomize directory that widens the race in every rank."""
    source = SCRIPT.read_text(encoding="utf-8")
    plain = _WORKAROUND.sub("", source)
    if plain == source or "gc.collect" in plain:
        raise RuntimeError(f"{SCRIPT} no longer has the workaround lines this benchmark removes")
    (work / "plain.py").write_text(plain, encoding="utf-8")
    stress = f"sys.setswitchinterval({switch_interval})\n" if switch_interval > 0 else ""
    paths = {"plain": work / "plain.py", "user-fix": SCRIPT}
    paths["site"] = work / "site"
    paths["site"].mkdir()
    text = f"import sys\n{stress}"
    (paths["site"] / "sitecustomize.py").write_text(text, encoding="utf-8")
    return paths


def one_run(setup: str, paths: Mapping[str, Path], work: Path) -> tuple[list[int], list[str]]:
    """Two ranks of one setup to the end: (return codes, stderr texts)."""
    port = harness.free_port()
    base = harness.clean_env(OMP_NUM_THREADS="1")
    store = None
    if setup == "no-libuv":
        base["USE_LIBUV"] = "0"
    elif setup == "agent-store":
        import torch.distributed as dist

        store = dist.TCPStore(
            "127.0.0.1", port, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=RUN_TIMEOUT_S),
        )  # fmt: skip
        base["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    base["PYTHONPATH"] = os.pathsep.join([str(paths["site"]), base["PYTHONPATH"]])
    if setup == "exit-grace":
        # What `trainbox exec` exports: its exit hook first, the stress one still runs after.
        base |= exit_grace.exported(base, grace_s=GRACE_S)
    script = paths["user-fix" if setup == "user-fix" else "plain"]
    cpus = sorted(os.sched_getaffinity(0))
    procs, errs = [], []
    for rank in range(2):
        err = (work / f"rank{rank}.err").open("w+", encoding="utf-8")
        env = base | harness.by_hand(rank, 2, port)
        cpu = {cpus[rank % len(cpus)]}
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(work / "out.json")],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, cpu),
            )
        )
        errs.append(err)
    codes = []
    try:
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=RUN_TIMEOUT_S))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        del store
    texts = []
    for err in errs:
        err.seek(0)
        texts.append(err.read())
        err.close()
    return codes, texts


def measure(setups: Sequence[str], reps: int, switch_interval: float) -> dict[str, Tally]:
    """`reps` runs of every setup, alternated."""
    tallies = {setup: Tally() for setup in setups}
    with harness.workdir("exit-abort") as work:
        paths = prepare(work, switch_interval)
        for rep in range(reps):
            for setup in setups:
                started = time.perf_counter()
                codes, texts = one_run(setup, paths, work)
                tally = tallies[setup]
                tally.runs += 1
                tally.seconds.append(time.perf_counter() - started)
                aborted = [
                    rank
                    for rank, (code, text) in enumerate(zip(codes, texts, strict=True))
                    if code in (-6, 134) or ABORT_TEXT in text
                ]
                if aborted:
                    tally.aborts += 1
                    tally.aborted_ranks.extend(aborted)
                elif any(codes):
                    tally.other_failures.append(f"rep {rep}: exit codes {codes}")
                print(f"{rep + 1}/{reps} {setup}: {codes}", file=sys.stderr, flush=True)
    return tallies


def report(tallies: Mapping[str, Tally]) -> str:
    """The result table: aborts per setup, side by side."""
    rows: list[list[Any]] = [["setup", "runs", "aborts", "rate", "aborted ranks", "other fails"]]
    for setup, tally in tallies.items():
        ranks = ",".join(str(r) for r in sorted(set(tally.aborted_ranks))) or "-"
        rate = f"{tally.aborts / tally.runs:.0%}" if tally.runs else "-"
        rows.append([setup, tally.runs, tally.aborts, rate, ranks, len(tally.other_failures)])
    return harness.table(rows)


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument(
        "--setups",
        help=f"comma-separated, of {', '.join(SETUPS)} (default: all; --quick: plain,exit-grace)",
    )
    parse.add_argument(
        "--switch-interval", type=float, default=0.5,
        help="GIL switch interval in the ranks, s (0: Python's default)",
    )  # fmt: skip
    args = parse.parse_args()
    chosen = args.setups or ",".join(QUICK_SETUPS if args.quick else SETUPS)
    setups = [name for name in chosen.split(",") if name]
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        parse.error(f"unknown setups: {', '.join(unknown)}")
    bench = harness.start("exit_abort", args, reps=REPS, quick_reps=QUICK_REPS)
    tallies = measure(setups, bench.reps, args.switch_interval)
    print(report(tallies))
    for setup, tally in tallies.items():
        for failure in tally.other_failures:
            print(f"{setup}: {failure}")
    results: dict[str, Any] = {"switch_interval_s": args.switch_interval}
    results |= {
        setup: {
            "runs": tally.runs,
            "aborts": tally.aborts,
            "aborted_ranks": tally.aborted_ranks,
            "other_failures": tally.other_failures,
            "median_run_s": harness.median(tally.seconds),
        }
        for setup, tally in tallies.items()
    }
    return bench.finish(results, positive=[harness.median(t.seconds) for t in tallies.values()])


if __name__ == "__main__":
    sys.exit(main())
