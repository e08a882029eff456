"""Per-rank costs that grow with the job: hostlists, peer agreement, and start-up file lookups.

    .venv/bin/python benchmarks/per_rank_costs.py            # 5 repetitions
    .venv/bin/python benchmarks/per_rank_costs.py --quick    # 1 repetition (CI)

1. Slurm hostlists of 10,000 nodes (compressed, fragmented, one name each) and a task-count list
   of 10,000 nodes: what launcher detection parses on every rank.
2. Peer agreement at N = 256, 1,024 and 4,096 simulated ranks (8 per node): the bytes rank 0
   receives, its judgement and table time, and the length of the error line a stale node gets.
3. Files one rank opens or stats from process start to the end of one training step, counted
   with `strace -f` for `trainbox run` and for the raw DDP loop (benchmarks/raw_ddp.py), both as
   rank 0 of 1 with the same model and data: thousands of ranks import from a shared filesystem
   at once, so every lookup is multiplied by N on the metadata server.

Targets: hostlist and task counts under 50 ms at 10,000 nodes; judgement at 4,096 ranks under
1 s; a mismatch line under 300 characters at any N; trainbox's start-up lookups at most 1.25x
the raw loop's.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import benchtask
import harness

from trainbox.distributed import peers
from trainbox.launch import hostlist

HERE = Path(__file__).resolve().parent
NODES = 10_000
RANKS = (256, 1024, 4096)
TARGET_PARSE_MS = 50.0
TARGET_JUDGE_S = 1.0
TARGET_LINE = 300
TARGET_LOOKUPS = 1.25
# Every call by which Python (or anything else) looks a path up.
LOOKUPS = ("open", "openat", "openat2", "stat", "lstat", "newfstatat", "statx", "access")
_CALL = re.compile(rf"^\d+\s+({'|'.join(LOOKUPS)})\(")
_RESUMED = re.compile(rf"^\d+\s+<\.\.\. ({'|'.join(LOOKUPS)}) resumed>")


def best_ms(work: Callable[[], object], reps: int) -> float:
    """The fastest of `reps` runs, in ms: the cost itself, not the noise of a shared machine."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return min(times)


def hostlists(reps: int) -> dict[str, float]:
    shapes = {
        "compressed": f"gpu[00000-{NODES - 1:05d}]",
        "fragmented": "gpu[" + ",".join(str(i) for i in range(1, 2 * NODES, 2)) + "]",
        "one name each": ",".join(f"node{i:05d}" for i in range(NODES)),
    }
    timed = {f"first_host, {name}": best_ms(lambda t=t: hostlist.first_host(t), reps)
             for name, t in shapes.items()}  # fmt: skip
    uneven = ",".join(f"{4 + i % 2}" for i in range(NODES))
    timed["task_counts, one entry per node"] = best_ms(
        lambda: hostlist.task_counts(uneven).on_node(NODES - 1), reps
    )
    return timed


def cluster(n: int, *, stale_node: int | None = None) -> list[peers.PeerFacts]:
    base = peers.PeerFacts(
        rank=0, host="node00000", trainbox="0.1.0", torch="2.13.0", cuda="12.8", nccl="2.27.3",
        image_revision="abc123", lock_sha256="0" * 64, config_hash="f" * 64,
        gpu_model="NVIDIA H100 80GB HBM3",
        node_cpus=96, cpu_budget=12, threads=10,
    )  # fmt: skip
    return [
        dataclasses.replace(
            base, rank=rank, host=f"node{rank // 8:05d}",
            image_revision="old999" if rank // 8 == stale_node else base.image_revision,
        )
        for rank in range(n)
    ]  # fmt: skip


def agreement(reps: int) -> list[dict[str, float]]:
    rows = []
    for n in RANKS:
        healthy, stale = cluster(n), cluster(n, stale_node=n // 16)
        record = pickle.dumps(healthy[-1])
        rows.append({
            "ranks": n,
            "bytes_per_rank": len(record),
            "rank0_receives_kb": n * len(record) / 1024,
            "judge_ms": best_ms(lambda h=healthy: peers.mismatches(h), reps),
            "table_ms": best_ms(lambda h=healthy: peers.table(h), reps),
            "mismatch_line_chars": len(peers.mismatches(stale)[0]),
        })  # fmt: skip
    return rows


def lookups(argv: list[str], env: dict[str, str], work: Path, name: str) -> dict[str, int]:
    """Path lookups by one rank's whole process tree, from start to exit."""
    trace = work / f"{name}.strace"
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={','.join(LOOKUPS)}", *argv],
        env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
    )  # fmt: skip
    return count_lookups(trace.read_text().splitlines())


def count_lookups(lines: list[str]) -> dict[str, int]:
    """Count `strace -f` lines of LOOKUPS calls; a call split by another thread counts once."""
    calls = [line for line in lines if _CALL.match(line)]
    # An interrupted call's result is on its `<... resumed>` line.
    results = [line for line in lines if _CALL.match(line) or _RESUMED.match(line)]
    return {"lookups": len(calls), "not_found": sum("ENOENT" in line for line in results)}


def startup(work: Path) -> dict[str, dict[str, int]]:
    task = ["--model-args", "{}", "--data-args", '{"size": 2048}']
    single = harness.by_hand(0, 1, harness.free_port())
    trainbox = [sys.executable, "-m", "trainbox", "run", f"run_dir={work / 'run'}",
                "train.max_steps=1", "train.eval_every=0", "pinning.num_workers=0",
                *benchtask.overrides({}, {"size": 2048})]  # fmt: skip
    raw = [sys.executable, str(HERE / "raw_ddp.py"), "--steps", "1", *task]
    return {
        "trainbox run": lookups(trainbox, harness.clean_env(**single), work, "trainbox"),
        "raw DDP loop": lookups(raw, harness.clean_env(**single), work, "raw"),
    }


def main() -> int:
    bench = harness.start("per_rank_costs", harness.parser(__doc__).parse_args(), reps=5)
    reps = bench.reps
    parsed = hostlists(reps)
    print(harness.table([["10,000 nodes", "ms"], *([k, v] for k, v in parsed.items())]))
    rows = agreement(reps)
    print(harness.table([list(rows[0])] + [list(row.values()) for row in rows]))
    if shutil.which("strace") is None:
        print("per_rank_costs: strace is not installed (bash .ci/install-system)", file=sys.stderr)
        return 1
    with harness.workdir("per-rank") as work:
        files = startup(work)
    heading = ["one rank, start to exit", "path lookups", "of them not found"]
    counts = [[side, v["lookups"], v["not_found"]] for side, v in files.items()]
    print(harness.table([heading, *counts]))
    share = files["trainbox run"]["lookups"] / files["raw DDP loop"]["lookups"]
    worst = rows[-1]
    checks = [
        ("hostlist parse at 10,000 nodes (ms)", max(parsed.values()), TARGET_PARSE_MS),
        ("agreement judgement at 4,096 ranks (s)", worst["judge_ms"] / 1000, TARGET_JUDGE_S),
        ("mismatch line at 4,096 ranks (chars)", max(r["mismatch_line_chars"] for r in rows),
         TARGET_LINE),
        ("start-up lookups, trainbox / raw", share, TARGET_LOOKUPS),
    ]  # fmt: skip
    for label, value, target in checks:
        bench.judge(label, value, at_most=target, shown=".3g")
    return bench.finish(
        {"hostlist_ms": parsed, "agreement": rows, "startup": files, "lookup_ratio": share},
        positive=[*parsed.values(), share],
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
