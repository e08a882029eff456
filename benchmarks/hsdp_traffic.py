"""fsdp against hsdp at 2 nodes x 2 ranks: the bytes that leave a node per step, steps/s, peak RSS.

    .venv/bin/python benchmarks/hsdp_traffic.py                 # 7.6M-parameter MLP, 3 runs a side
    .venv/bin/python benchmarks/hsdp_traffic.py --quick         # a tiny MLP, each side once (CI)
    python benchmarks/hsdp_traffic.py --device cuda             # one GPU per rank, NCCL (4 GPUs)

Each side is `trainbox run` with train.strategy=fsdp or =hsdp, started as two torchrun agents
(`--nnodes=2 --nproc-per-node=2`) that meet by c10d rendezvous on 127.0.0.1: two "nodes" of two
ranks on this machine, so every rank's LOCAL_WORLD_SIZE is 2 and hsdp's default mesh is
(replicate 2, shard 2). The sides alternate. Every rank runs under rss_probe.py (its peak RSS)
and traffic_probe.py, which counts each collective torch.distributed makes by kind, group ranks
and bytes. Those counts become the bytes that leave each node per step by node_traffic.py's
model (a ring between the nodes a group spans, ranks of a node combining first): under fsdp
every unit's all-gathers (forward and backward) and reduce-scatter span both nodes; under hsdp
they stay in a node and only one all-reduce of each gradient shard crosses. The same model
predicts the number from the run's mesh and the model's parameters (FSDP2's padding included);
counted must equal predicted, collective for collective. trainbox's own collectives (the stop
vote, metrics) are counted apart and reported.

`--device cuda` gives each agent two GPUs of its own (CUDA_VISIBLE_DEVICES), so four are needed;
it also reports each rank's peak CUDA allocation. Otherwise every rank runs on the CPU with gloo
and one intra-op thread: steps/s then share this machine's CPUs and compare the sides with each
other, not with a cluster. fp32 throughout (train.amp=off), so all bytes are 4 a parameter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import benchtask
import fsdp_memory
import harness
import node_traffic

HERE = Path(__file__).resolve().parent
FULL = {"in_features": 256, "classes": 10, "hidden": 1024, "layers": 8}
TINY = {"in_features": 32, "classes": 10, "hidden": 64, "layers": 2}
NODES, RANKS_PER_NODE = 2, 2
WORLD = NODES * RANKS_PER_NODE
SIDES = ("fsdp", "hsdp")
MIB = 2**20
Result = dict[str, Any]


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cuda: one GPU per rank, NCCL (needs 4)")  # fmt: skip
    args = parse.parse_args()
    bench = harness.start("hsdp_traffic", args, reps=3)
    if args.device == "cuda" and len(gpus()) < WORLD:
        parse.error(f"--device cuda needs {WORLD} GPUs (one per rank); {len(gpus())} visible")
    model_args = TINY if args.quick else FULL
    steps, warmup, log_every = (6, 2, 2) if args.quick else (20, 5, 5)
    data_args = {"size": 2048, "in_features": model_args["in_features"], "classes": 10}
    setting = {"steps": steps, "warmup": warmup, "log_every": log_every, "batch": 8,
               "model": model_args, "data": data_args, "device": args.device,
               "nodes": NODES, "ranks_per_node": RANKS_PER_NODE}  # fmt: skip
    units = node_traffic.units_of(benchtask.model(**model_args))
    runs = bench.rounds([(name, side(name, setting, units)) for name in SIDES])
    params = sum(p.numel() for p in benchtask.model(**model_args).parameters())
    summary = {name: summarize(found) for name, found in runs.items()}
    print(report(summary, params))
    holds = facts(summary, bench.reps)
    if holds["every run of both sides finished"]:
        fsdp, hsdp = summary["fsdp"], summary["hsdp"]
        ratio = hsdp["bytes_leaving_per_step"] / fsdp["bytes_leaving_per_step"]
        hsdp["bytes_vs_fsdp"] = ratio
        hsdp["steps_per_s_vs_fsdp"] = hsdp["steps_per_s"] / fsdp["steps_per_s"]
        print(f"hsdp / fsdp bytes leaving a node per step: {ratio:.3f}")
    positive = [row[key] for row in summary.values() for key in ("steps_per_s", "peak_rss_mib")
                if key in row]  # fmt: skip
    results = {"settings": {**setting, "reps": bench.reps, "threads": 1}, "params": params,
               "runs": runs, "summary": summary}  # fmt: skip
    return bench.finish(results, positive=positive, holds=holds)


def gpus() -> list[str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES names them."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed[:count] if listed else [str(i) for i in range(count)]


def side(
    strategy: str, setting: dict[str, Any], units: Sequence[node_traffic.Unit]
) -> Callable[[], Result]:
    """One run of `strategy` on 2 x 2 ranks: its traffic, counted and predicted, steps/s, RSS."""

    def run() -> Result:
        with harness.workdir(f"hsdp-traffic-{strategy}") as work:
            started = time.perf_counter()
            failed = agents(work, fsdp_memory.trainbox(strategy, work, setting), setting)
            wall = time.perf_counter() - started
            if failed:
                print(f"  {strategy} did not finish:\n{failed}", file=sys.stderr, flush=True)
                return {"finished": False, "wall_s": wall, "error": failed}
            return {"finished": True, "wall_s": wall, **measured(work, setting, units)}

    return run


def agents(work: Path, program: list[str], setting: dict[str, Any]) -> str:
    """Two torchrun agents, one a node, meeting on a free port; '' or the failures' output."""
    # One rendezvous, on a port nobody holds, under an id both agents share.
    meeting = [f"--rdzv-endpoint=127.0.0.1:{harness.free_port()}",
               f"--rdzv-id=hsdp-traffic-{time.monotonic_ns()}"]  # fmt: skip
    probes = [str(HERE / "rss_probe.py"), str(work), str(HERE / "traffic_probe.py"), str(work)]
    devices = gpus() if setting["device"] == "cuda" else []
    procs = []
    for node in range(NODES):
        mine = ",".join(devices[node * RANKS_PER_NODE : (node + 1) * RANKS_PER_NODE])
        env = harness.clean_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=mine)
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}",
                f"--node-rank={node}", f"--nproc-per-node={RANKS_PER_NODE}",
                "--rdzv-backend=c10d", *meeting, *probes, *program]  # fmt: skip
        # A session of its own: a stuck agent is stopped with the ranks it started.
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))  # fmt: skip
    # Far above a run's 10-20 s here, and inside the GPU proof's 900 s for the whole benchmark.
    deadline = time.monotonic() + (300 if setting["steps"] < 10 else 600)
    outputs = [finished(proc, deadline) for proc in procs]
    return "\n".join(f"agent {node} exited {proc.returncode}:\n{out[-3000:]}"
                     for node, (proc, out) in enumerate(zip(procs, outputs, strict=True))
                     if proc.returncode != 0)  # fmt: skip


def finished(proc: subprocess.Popen[str], deadline: float) -> str:
    """The agent's output once it ends; at the deadline its session is killed first."""
    try:
        return proc.communicate(timeout=max(deadline - time.monotonic(), 1))[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[0] + "\n(killed at the deadline)"


def measured(work: Path, setting: dict[str, Any], units: Sequence[node_traffic.Unit]) -> Result:
    """A finished run's figures: its traffic against the prediction from its own mesh."""
    ranks = range(WORLD)
    files = [json.loads((work / f"traffic-{r}.json").read_text()) for r in ranks]
    mesh = json.loads((work / "run" / "run.json").read_text())["mesh"]
    shape = (mesh["replicate"], mesh["shard"])
    steps = setting["steps"]
    predicted = node_traffic.predict_step(shape, units)
    fsdp, other = node_traffic.counted(files)

    def per_step(found: dict[node_traffic.Collective, int], divide: int) -> list[float]:
        leaving = node_traffic.bytes_leaving(found, RANKS_PER_NODE, NODES)
        return [size / divide for size in leaving]

    cuda = [f["cuda_peak_bytes"] for f in files]
    marks = harness.train_marks(work / "run")
    return {
        "mesh": list(shape),
        "bytes_leaving_per_step": per_step(fsdp, steps),
        "predicted_bytes_leaving_per_step": per_step(predicted, 1),
        "counted_equals_predicted": fsdp == {c: n * steps for c, n in predicted.items()},
        "fsdp_collectives_per_step": sum(fsdp.values()) / steps,
        "trainbox_bytes_leaving_per_step": per_step(other, steps),
        "ranks_on_their_nodes": all(f["node"] == f["rank"] // RANKS_PER_NODE for f in files),
        "steps_per_s": 1 / harness.steady_step_time(marks, warmup=setting["warmup"]),
        "peak_rss_mib": [json.loads((work / f"rank-{r}.json").read_text())["peak_rss_mib"]
                         for r in ranks],
        **({"cuda_peak_mib": [b / MIB for b in cuda]} if all(cuda) else {}),
    }  # fmt: skip


def summarize(found: list[Result]) -> Result:
    """One side over its finished runs: medians of speed and memory; the traffic of each run."""
    done = [r for r in found if r["finished"]]
    if not done:
        return {"finished_runs": 0}
    # Every run makes the same collectives: the figures are the first's, the checks all runs'.
    first = done[0]
    row: Result = {
        "finished_runs": len(done),
        "mesh": first["mesh"],
        "bytes_leaving_per_step": max(first["bytes_leaving_per_step"]),
        "predicted_bytes_leaving_per_step": max(first["predicted_bytes_leaving_per_step"]),
        "bytes_leaving_per_node": first["bytes_leaving_per_step"],
        "trainbox_bytes_leaving_per_step": max(first["trainbox_bytes_leaving_per_step"]),
        "fsdp_collectives_per_step": first["fsdp_collectives_per_step"],
        "counted_equals_predicted": all(r["counted_equals_predicted"] for r in done),
        "same_traffic_every_run": all(
            r["bytes_leaving_per_step"] == first["bytes_leaving_per_step"] for r in done
        ),
        "ranks_on_their_nodes": all(r["ranks_on_their_nodes"] for r in done),
        "steps_per_s": harness.median(r["steps_per_s"] for r in done),
        "peak_rss_mib": harness.median(max(r["peak_rss_mib"]) for r in done),
        "peak_rss_mib_per_rank": [harness.median(vs) for vs in
                                  zip(*(r["peak_rss_mib"] for r in done), strict=True)],
        "wall_s": harness.median(r["wall_s"] for r in done),
    }  # fmt: skip
    if "cuda_peak_mib" in first:
        row["cuda_peak_mib"] = harness.median(max(r["cuda_peak_mib"]) for r in done)
    return row


def facts(summary: dict[str, Result], reps: int) -> dict[str, bool]:
    """What a run must show to count: both sides trained, traffic as predicted, hsdp's less."""
    finished = all(row["finished_runs"] == reps for row in summary.values())
    fsdp, hsdp = summary["fsdp"], summary["hsdp"]
    return {
        "every run of both sides finished": finished,
        "counted equals predicted, collective for collective":
            finished and all(row["counted_equals_predicted"] for row in summary.values()),
        "every run of a side made the same collectives":
            finished and all(row["same_traffic_every_run"] for row in summary.values()),
        "ranks sit on nodes as rank // ranks per node":
            finished and all(row["ranks_on_their_nodes"] for row in summary.values()),
        "meshes (1, 4) for fsdp and (2, 2) for hsdp":
            finished and (fsdp["mesh"], hsdp["mesh"]) == ([1, WORLD], [NODES, RANKS_PER_NODE]),
        "hsdp sends fewer bytes out of a node than fsdp":
            finished and hsdp["bytes_leaving_per_step"] < fsdp["bytes_leaving_per_step"],
    }  # fmt: skip


def report(summary: dict[str, Result], params: int) -> str:
    """The table, and a line on what its bytes count."""
    rows = [["side", "mesh", "MB out of a node/step: counted", "predicted", "equal",
             "trainbox's own", "steps/s", "peak RSS/rank MiB (max)", "per rank",
             "wall s"]]  # fmt: skip
    for name, row in summary.items():
        if not row["finished_runs"]:
            rows.append([name, "did not finish"])
            continue
        rows.append([
            name, "x".join(map(str, row["mesh"])), row["bytes_leaving_per_step"] / 1e6,
            row["predicted_bytes_leaving_per_step"] / 1e6, row["counted_equals_predicted"],
            row["trainbox_bytes_leaving_per_step"] / 1e6, row["steps_per_s"], row["peak_rss_mib"],
            harness.spread(row["peak_rss_mib_per_rank"]), row["wall_s"],
        ])  # fmt: skip
    return (
        f"{params / 1e6:.2f}M parameters, {WORLD} ranks as {NODES} nodes of {RANKS_PER_NODE};"
        " bytes out of a node: FSDP2's collectives by node_traffic.py's ring model"
        " (trainbox's own apart)\n" + harness.table(rows)
    )


if __name__ == "__main__":
    raise SystemExit(main())
