"""`trainbox exec` against the same command without it: compute speed and start time.

    .venv/bin/python benchmarks/exec_overhead.py            # 5 repetitions per side
    .venv/bin/python benchmarks/exec_overhead.py --quick    # 1 repetition (CI)

Compute: a loop of 1024x1024 float32 matmuls, timed inside the process, under plain python and
behind `trainbox exec` (one process, no launcher). exec must hand the script its whole CPU
budget as threads: target ratio (plain time / exec time) >= 0.95.

Start time: from Popen to the end of a command that does nothing (`python -c pass`), with and
without `trainbox exec` in front, per launcher: no launcher (one process), torchrun (2 workers),
mpirun (2 ranks), and 2 ranks exported by hand (`env`, the path srun tasks and Kubeflow pods
take, where the ranks meet at the master before the command starts). The difference is what
exec adds to a job's start; reported, not judged.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import harness

TARGET_RATIO = 0.95
MATMUL = """
import sys, time, torch
a = torch.randn(1024, 1024); b = torch.randn(1024, 1024)
a @ b
start = time.perf_counter()
for _ in range(int(sys.argv[1])):
    a @ b
print("matmul_s", time.perf_counter() - start, torch.get_num_threads())
"""
EXEC = [sys.executable, "-m", "trainbox", "exec", "--"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def matmul_side(prefix: Sequence[str], count: int) -> Callable[[], float]:
    """Seconds the matmul loop took inside the process started with `prefix`."""

    def side() -> float:
        out = harness.run([*prefix, sys.executable, "-c", MATMUL, str(count)], harness.clean_env())
        line = [line for line in out.splitlines() if line.startswith("matmul_s")][-1]
        return float(line.split()[1])

    return side


def start_side(argv: Callable[[], list[str]], *, ranks: int = 1) -> Callable[[], float]:
    """Seconds from starting `argv()` (as `ranks` by-hand ranks when > 1) to its end."""

    def side() -> float:
        env = harness.clean_env(OMP_NUM_THREADS="1")
        started = time.perf_counter()
        if ranks == 1:
            harness.run(argv(), env)
        else:
            port = harness.free_port()
            procs = [
                subprocess.Popen(
                    argv(),
                    env=env | harness.by_hand(rank, ranks, port),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for rank in range(ranks)
            ]
            codes = [proc.wait(timeout=120) for proc in procs]
            if any(codes):
                raise RuntimeError(f"{argv()} by hand exited {codes}")
        return time.perf_counter() - started

    return side


def launchers() -> list[tuple[str, Callable[[list[str]], list[str]], int]]:
    """(name, argv around a command, ranks started by hand) for each launcher here."""
    found: list[tuple[str, Callable[[list[str]], list[str]], int]] = [
        ("none", lambda cmd: cmd, 1),
        ("torchrun", lambda cmd: [*harness.torchrun(2, "--no-python"), *cmd], 1),
        ("env (by hand)", lambda cmd: cmd, 2),
    ]
    if shutil.which("mpirun"):
        found.append(("mpirun", lambda cmd: [*MPIRUN, *cmd], 1))
    return found


def main() -> int:
    bench = harness.start("exec_overhead", harness.parser(__doc__).parse_args(), reps=5)
    count = 20 if bench.quick else 100
    nothing = [sys.executable, "-c", "pass"]
    compute = bench.rounds(
        [("plain", matmul_side([], count)), ("exec", matmul_side(EXEC, count))], quiet=False
    )
    ratio = harness.ratio(compute["plain"], compute["exec"])
    rows: list[list[object]] = [["launcher", "plain s", "exec s", "exec adds s"]]
    starts: dict[str, dict[str, float]] = {}
    for name, around, ranks in launchers():
        sides = [
            ("plain", start_side(lambda a=around: a(nothing), ranks=ranks)),
            ("exec", start_side(lambda a=around: a([*EXEC, *nothing]), ranks=ranks)),
        ]
        measured = bench.rounds(sides, quiet=False)
        plain, wrapped = harness.median(measured["plain"]), harness.median(measured["exec"])
        starts[name] = {"plain_s": plain, "exec_s": wrapped, "added_s": wrapped - plain}
        rows.append([name, plain, wrapped, wrapped - plain])

    print(f"matmul loop ({count} x 1024^2), median of {bench.reps}:")
    plain, wrapped = harness.median(compute["plain"]), harness.median(compute["exec"])
    print(f"  plain {plain:.3f} s, exec {wrapped:.3f} s")
    bench.judge("  ratio plain/exec", ratio, at_least=TARGET_RATIO)
    print("start to end of `python -c pass`, median:")
    print(harness.table(rows))
    results = {"matmul_ratio": ratio, "matmul": compute, "start": starts}
    return bench.finish(results, positive=[*compute["plain"], *compute["exec"]])


if __name__ == "__main__":
    raise SystemExit(main())
