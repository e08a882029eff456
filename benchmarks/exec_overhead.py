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
        from freeport import free_port

        env = harness.clean_env(OMP_NUM_THREADS="1")
        started = time.perf_counter()
        if ranks == 1:
            harness.run(argv(), env)
        else:
            port = str(free_port())
            procs = [
                subprocess.Popen(
                    argv(),
                    env=env | by_hand(rank, ranks, port),
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


def by_hand(rank: int, world: int, port: str) -> dict[str, str]:
    """The variables of rank `rank` of an env:// job exported by hand."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port}  # fmt: skip


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
    args = harness.parser(__doc__).parse_args()
    reps = args.reps or (1 if args.quick else 5)
    count = 20 if args.quick else 100
    sys.path.insert(0, str(harness.ROOT / "tests"))
    nothing = [sys.executable, "-c", "pass"]

    compute = harness.interleave(
        reps, [("plain", matmul_side([], count)), ("exec", matmul_side(EXEC, count))]
    )
    ratio = harness.ratio(compute["plain"], compute["exec"])
    rows: list[list[object]] = [["launcher", "plain s", "exec s", "exec adds s"]]
    starts: dict[str, dict[str, float]] = {}
    for name, around, ranks in launchers():
        sides = [
            ("plain", start_side(lambda a=around: a(nothing), ranks=ranks)),
            ("exec", start_side(lambda a=around: a([*EXEC, *nothing]), ranks=ranks)),
        ]
        measured = harness.interleave(reps, sides)
        plain, wrapped = harness.median(measured["plain"]), harness.median(measured["exec"])
        starts[name] = {"plain_s": plain, "exec_s": wrapped, "added_s": wrapped - plain}
        rows.append([name, plain, wrapped, wrapped - plain])

    print(f"matmul loop ({count} x 1024^2), median of {reps}:")
    plain, wrapped = harness.median(compute["plain"]), harness.median(compute["exec"])
    print(f"  plain {plain:.3f} s, exec {wrapped:.3f} s")
    print(f"  ratio plain/exec {ratio:.3f} (target >= {TARGET_RATIO}): "
          f"{harness.verdict(ratio >= TARGET_RATIO, quick=args.quick)}")  # fmt: skip
    print("start to end of `python -c pass`, median:")
    print(harness.table(rows))
    results = {"matmul_ratio": ratio, "matmul": compute, "start": starts}
    positive = [*compute["plain"], *compute["exec"]]
    return harness.finish(
        "exec_overhead", results, positive=positive, quick=args.quick, save=args.save
    )


if __name__ == "__main__":
    raise SystemExit(main())
