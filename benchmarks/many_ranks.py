"""Many real ranks on one machine: time to first step against the raw loop, and the guarantees.

    .venv/bin/python benchmarks/many_ranks.py                       # 8-48 ranks; checks at 48
    .venv/bin/python benchmarks/many_ranks.py --ranks 8 --checks 8  # smaller
    .venv/bin/python benchmarks/many_ranks.py --quick               # 2 ranks, no checks (CI)

1. Time to first step of `trainbox run` and of the raw DDP loop (benchmarks/raw_ddp.py), both
   under `torchrun --standalone --nproc-per-node N`, interleaved (benchmarks/first_step.py's
   measurement). On 2 CPUs both are dominated by N imports of torch.
2. At `--checks N` ranks, with the built-in example:
   - stop: a SIGUSR1 on one rank stops every rank after one agreed step, exit 143, with a
     checkpoint (node mode, `dist.procs_per_node=N`, whose supervisor reports the workers' code);
   - resume: the rerun ends with the params_sha256 of an uninterrupted N-rank run;
   - kill: N ranks started by hand (no agent, as a multi-node job's ranks are), one killed with
     SIGKILL; every survivor must exit 4 naming that rank within dist.timeout_s + 30 s.
3. `--slurm N` (root, Slurm and munge: bash .ci/install-system): the same stop, resume and kill
   checks as `srun -N2 -n N` on the local two-node cluster of tests/launchers/slurm_cluster.py,
   each node advertising N/2 CPUs.
Each rank takes memory (benchmarks/README.md has how much, and how many ranks fit this machine).
These are benchmarks, not CI tests; the CI cases are tests/dist/test_eight_ranks.py and
tests/dist/test_hang_blame.py.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import first_step
import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

RANKS = (8, 16, 32, 48)
CHECK_CONFIG = ["train.max_steps=40", "train.log_every=5", "train.eval_every=0",
                "train.ckpt_every=10"]  # fmt: skip
TIMEOUT_S = 30.0
# A verdict may come after the timeout, the watchdog's grace and the slowest rank's exit.
BOUND_S = TIMEOUT_S + 30.0
EXITED = r"tasks? ([\d,-]+): Exited with exit code (\d+)"
# `srun --label` puts each task's number before its lines.
LABELLED_ERROR = r"^\s*(\d+): (trainbox: error:.*)$"


def first_steps(ranks: tuple[int, ...], bench: harness.Bench) -> list[dict[str, Any]]:
    env = harness.clean_env(OMP_NUM_THREADS="1")
    rows = []
    for n in ranks:
        sides = bench.rounds([
            ("trainbox", lambda n=n: first_step.trainbox_first_step(env, n)),
            ("raw", lambda n=n: first_step.raw_first_step(env, n)),
        ], quiet=False)  # fmt: skip
        rows.append({"ranks": n, "trainbox_s": harness.median(sides["trainbox"]),
                     "raw_s": harness.median(sides["raw"]), "runs": sides})  # fmt: skip
    return rows


# How one run is started: (run_dir, n ranks, extra environment) -> exit code.
Launch = Callable[[Path, int, dict[str, str]], int]


def node_mode(work: Path, n: int, env: dict[str, str]) -> int:
    argv = [sys.executable, "-m", "trainbox", "run", f"run_dir={work}", *CHECK_CONFIG,
            f"dist.procs_per_node={n}"]  # fmt: skip
    with (work.parent / f"{work.name}.log").open("a") as log:
        return subprocess.run(
            argv, env=harness.clean_env(OMP_NUM_THREADS="1", **env), stdout=log,
            stderr=subprocess.STDOUT, check=False, timeout=1800,
        ).returncode  # fmt: skip


def with_srun(cluster: Any) -> Launch:
    def launch(work: Path, n: int, env: dict[str, str]) -> int:
        argv = ["srun", "-N2", f"-n{n}", sys.executable, "-m", "trainbox", "run",
                f"run_dir={work}", *CHECK_CONFIG]  # fmt: skip
        with (work.parent / f"{work.name}.log").open("a") as log:
            return subprocess.run(
                argv, env={**cluster.env, "OMP_NUM_THREADS": "1", **env}, cwd=cluster.workdir,
                stdout=log, stderr=subprocess.STDOUT, check=False, timeout=1800,
            ).returncode  # fmt: skip

    return launch


def params(run_dir: Path) -> str:
    return str(json.loads((run_dir / "summary.json").read_text())["params_sha256"])


def stop_and_resume(work: Path, n: int, launch: Launch) -> dict[str, Any]:
    whole, stopped = work / "whole", work / "stopped"
    for folder in (whole, stopped):
        folder.mkdir()
    launch(whole, n, {})
    code = launch(stopped, n, {"TRAINBOX_FAULT": f"signal:rank={n - 3}:step=15:sig=USR1"})
    if not (whole / "summary.json").is_file() or not (stopped / "metrics.jsonl").is_file():
        return {"ok": False, "exit": code, "logs": {name: _tail(work / f"{name}.log")
                                                   for name in ("whole", "stopped")}}  # fmt: skip
    last = json.loads((stopped / "metrics.jsonl").read_text().splitlines()[-1])
    step = last.get("step")
    checkpoint = (stopped / "checkpoints" / f"step-{step:08d}.pt").is_file()
    launch(stopped, n, {})
    same = params(stopped) == params(whole)
    return {"exit": code, "stop_step": step, "checkpoint": checkpoint, "bit_exact": same,
            "ok": code == 143 and last.get("kind") == "stop" and checkpoint and same}  # fmt: skip


def killed_rank(work: Path, n: int) -> dict[str, Any]:
    victim, port = n // 2 + 1, harness.free_port()
    logs, procs = [], []
    for rank in range(n):
        env = harness.clean_env(
            OMP_NUM_THREADS="1", TRAINBOX_FAULT=f"kill:rank={victim}:step=20",
            **harness.by_hand(rank, n, port),
        )  # fmt: skip
        argv = [sys.executable, "-m", "trainbox", "run", f"run_dir={work / 'killed'}",
                *CHECK_CONFIG, "train.max_steps=100000",
                f"dist.timeout_s={TIMEOUT_S:g}"]  # fmt: skip
        logs.append((work / f"rank{rank}.log").open("w"))
        procs.append(subprocess.Popen(argv, env=env, stdout=logs[-1], stderr=subprocess.STDOUT))
    codes = [proc.wait(timeout=1800) for proc in procs]
    ended = time.time()
    for log in logs:
        log.close()
    lines = [_error_line((work / f"rank{rank}.log").read_text()) for rank in range(n)]
    survivors = [rank for rank in range(n) if rank != victim]
    named = [rank for rank in survivors if re.search(rf"\brank {victim}\b", lines[rank])]
    died = (work / f"rank{victim}.log").stat().st_mtime
    return {
        "victim": victim, "survivors": len(survivors),
        "exit_4": sum(codes[r] == 4 for r in survivors),
        "named_victim": len(named), "longest_line": max(len(lines[r]) for r in survivors),
        "last_exit_after_kill_s": ended - died, "example": lines[survivors[0]],
        "ok": len(named) == len(survivors) and all(codes[r] == 4 for r in survivors)
        and ended - died <= BOUND_S,
    }  # fmt: skip


def srun_killed_rank(work: Path, n: int, cluster: Any) -> dict[str, Any]:
    """`srun -N2 -nN --label` with one task SIGKILLed: srun's own lines say who exited how."""
    victim = n // 2 + 1
    argv = ["srun", "-N2", f"-n{n}", "--label", sys.executable, "-m", "trainbox", "run",
            f"run_dir={work / 'srun-killed'}", *CHECK_CONFIG, "train.max_steps=100000",
            f"dist.timeout_s={TIMEOUT_S:g}"]  # fmt: skip
    env = {**cluster.env, "OMP_NUM_THREADS": "1", "TRAINBOX_FAULT": f"kill:rank={victim}:step=20"}
    proc = subprocess.Popen(argv, env=env, cwd=cluster.workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert proc.stdout is not None
    lines, died = [], None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if died is None and re.search(rf"task {victim}: Killed", line):
            died = time.time()
    proc.wait(timeout=1800)
    ended = time.time()
    text = "\n".join(lines)
    # srun groups tasks alike: `srun: error: n1: tasks 0-5,7: Exited with exit code 4`.
    codes = {task: int(code) for tasks, code in re.findall(EXITED, text)
             for task in _task_ids(tasks)}  # fmt: skip
    errors = {int(task): line for task, line in re.findall(LABELLED_ERROR, text, re.M)}
    survivors = [rank for rank in range(n) if rank != victim]
    named = [r for r in survivors if re.search(rf"\brank {victim}\b", errors.get(r, ""))]
    after = ended - died if died is not None else float("inf")
    return {
        "victim": victim, "survivors": len(survivors),
        "exit_4": sum(codes.get(r) == 4 for r in survivors), "named_victim": len(named),
        "last_exit_after_kill_s": after, "example": errors.get(survivors[0], ""),
        "ok": len(named) == len(survivors) and all(codes.get(r) == 4 for r in survivors)
        and after <= BOUND_S,
    }  # fmt: skip


def _task_ids(text: str) -> list[int]:
    ids = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ids += range(int(low), int(high or low) + 1)
    return ids


def slurm_checks(n: int) -> dict[str, Any]:
    from launchers.slurm_cluster import start_cluster

    work = Path(tempfile.mkdtemp(prefix="tb-slurm-", dir="/tmp"))
    try:
        with start_cluster(work / "c", python_bin_dir=Path(sys.executable).parent,
                           cpus_per_node=n // 2) as cluster:  # fmt: skip
            runs = work / "runs"
            runs.mkdir()
            return {"stop_resume": stop_and_resume(runs, n, with_srun(cluster)),
                    "killed": srun_killed_rank(runs, n, cluster)}  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def _error_line(text: str) -> str:
    found = [line for line in text.splitlines() if line.startswith("trainbox: error:")]
    return found[-1] if found else ""


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--ranks", type=int, nargs="+", default=None, help="first-step sizes")
    parse.add_argument("--checks", type=int, default=None, help="ranks for the checks (0: none)")
    parse.add_argument("--slurm", type=int, default=0, help="srun -N2 -n N checks (0: none)")
    args = parse.parse_args()
    bench = harness.start("many_ranks", args, reps=1)
    ranks = tuple(args.ranks or ((2,) if args.quick else RANKS))
    checks = args.checks if args.checks is not None else (0 if args.quick else max(ranks))
    rows = first_steps(ranks, bench)
    print(harness.table([["ranks", "trainbox first step (s)", "raw (s)", "trainbox - raw (s)"]] + [
        [r["ranks"], r["trainbox_s"], r["raw_s"], r["trainbox_s"] - r["raw_s"]] for r in rows
    ]))  # fmt: skip
    results: dict[str, Any] = {"first_step": rows, "checks_at": checks}
    if checks:
        with harness.workdir("many-ranks") as work:
            results["stop_resume"] = stop_and_resume(work, checks, node_mode)
            results["killed"] = killed_rank(work, checks)
    if args.slurm:
        results["slurm"] = slurm_checks(args.slurm)
        results.update({f"slurm_{k}": v for k, v in results.pop("slurm").items()})
    checked = [name for name in ("stop_resume", "killed", "slurm_stop_resume", "slurm_killed")
               if name in results]  # fmt: skip
    for name in checked:
        print(f"{name}: {'PASS' if results[name]['ok'] else 'FAIL'} {json.dumps(results[name])}")
    code = bench.finish(results, positive=[v for r in rows for v in (r["trainbox_s"], r["raw_s"])])
    return 1 if any(not results[name]["ok"] for name in checked) else code


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise SystemExit(main())
