"""Scaling: trainbox's samples/s at 1 and 2 processes on CPU, and a PROJECTION for N GPUs.

    .venv/bin/python benchmarks/scaling.py            # 3 repetitions per side
    .venv/bin/python benchmarks/scaling.py --quick    # 1 short repetition (CI)

Measured: `trainbox run` under torchrun with 1 and with 2 processes (alternating), the same
per-process batch (weak scaling) and one intra-op thread per process, so that 2 processes use
twice the CPUs; an MLP of ~2.4M parameters (256 -> 1024 -> 1024 -> 1024 -> 10), batch 64.
Steady-state samples/s from metrics.jsonl; efficiency = samples/s(2) / (2 * samples/s(1)).

PROJECTED, not measured: efficiency of data-parallel training on N GPUs for a model of P
parameters (fp32 gradients) that computes for t per step, backward 2/3 of it. Each GPU sends and
receives V = 2 (N-1)/N * 4P bytes per step in a ring all-reduce; at a bus bandwidth B (nccl-tests'
`busbw`) and a per-hop latency a, t_comm = V / B + k * 2 (N-1) * a for DDP's k gradient buckets
(25 MiB). DDP all-reduces a bucket as soon as the backward pass has filled it, so all but the
last bucket can hide behind the backward pass: exposed = max(t_comm / k, t_comm - t_bwd (k-1)/k),
and efficiency = t / (t + exposed). B is an assumption, given as a range in the table.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import benchtask
import harness

MODEL_ARGS = {"in_features": 256, "classes": 10, "hidden": 1024, "layers": 3}
DATA_ARGS = {"size": 32768, "in_features": 256, "classes": 10}
# Assumed all-reduce bus bandwidths (GB/s), from NVLink inside a node down to a shared
# Ethernet link between nodes; the orders of magnitude, not any one machine's figures.
BUSBW_GB_PER_S = (300.0, 100.0, 25.0, 5.0)
# Assumed latency per ring hop (seconds).
HOP_LATENCY_S = 10e-6
PROJECTED_N = (2, 8, 16, 64)


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--batch-size", type=int, default=64)
    parse.add_argument("--project-params", type=float, default=100.7e6, help="P (projection)")
    parse.add_argument(
        "--project-step-ms",
        type=float,
        nargs="+",
        default=[100.0, 25.0],
        help="compute times per step (projection)",
    )
    parse.add_argument("--allreduce-worker", type=int, help=argparse.SUPPRESS)
    parse.add_argument("--out", help=argparse.SUPPRESS)
    args = parse.parse_args()
    if args.allreduce_worker:
        return allreduce_worker(args.allreduce_worker, args.out)
    bench = harness.start("scaling", args, reps=3)
    steps, warmup, log_every = (30, 10, 10) if args.quick else (400, 100, 25)
    common = {"steps": steps, "warmup": warmup, "log_every": log_every, "batch": args.batch_size}
    runs = bench.rounds([(f"{n} proc", _side(n, **common)) for n in (1, 2)])
    rates = {
        name: [args.batch_size * int(name.split()[0]) / t for t in times]
        for name, times in runs.items()
    }
    one, two = harness.median(rates["1 proc"]), harness.median(rates["2 proc"])
    efficiency = two / (2 * one)
    rows = [["processes", "median samples/s", "median step (ms)", "runs (samples/s)"]]
    for name, values in rates.items():
        rows.append([name, harness.median(values), harness.median(runs[name]) * 1000,
                     harness.spread(values)])  # fmt: skip
    print(harness.table(rows))
    print(f"scaling 1 -> 2 processes on CPU: {two / one:.3f}x, efficiency {efficiency:.3f}")
    # The projection's model, checked where it can be: the gradient all-reduce measured alone.
    params = sum(p.numel() for p in benchtask.model(**MODEL_ARGS).parameters())
    if not args.quick:
        harness.wait_quiet()
    allreduce_s = allreduce_time(params)
    t1, t2 = harness.median(runs["1 proc"]), harness.median(runs["2 proc"])
    print(
        f"gradient all-reduce alone (gloo, 2 processes, {params * 4 / 1e6:.1f} MB):"
        f" {allreduce_s * 1000:.1f} ms, bus bandwidth"
        f" {allreduce_bytes(params, 2) / allreduce_s / 1e9:.2f} GB/s; 1-process step + all-reduce"
        f" = {(t1 + allreduce_s) * 1000:.1f} ms against {t2 * 1000:.1f} ms measured at 2 processes"
        " (no overlap: each rank's one CPU runs both its compute and gloo)"
    )
    big = args.project_params
    projections = {}
    for step_ms in args.project_step_ms:
        projections[f"{step_ms:g} ms"] = projection = project_table(big, step_ms / 1000)
        hidden = allreduce_bytes(big, 64) / (2 / 3 * step_ms / 1000) / 1e9
        print(
            f"\nPROJECTION (not measured): efficiency on N GPUs for P = {big / 1e6:.1f}M"
            f" parameters, {step_ms:g} ms compute per step (backward 2/3 of it),"
            f" {HOP_LATENCY_S * 1e6:g} us per ring hop; the all-reduce hides behind the"
            f" backward pass from about {hidden:.0f} GB/s"
        )
        header = ["assumed busbw", *(f"N={n}" for n in PROJECTED_N)]
        print(harness.table([header] + [
            [busbw, *(values[str(n)] for n in PROJECTED_N)]
            for busbw, values in projection.items()
        ]))  # fmt: skip
    volume = allreduce_bytes(big, 8)
    print(f"all-reduce volume per GPU and step: {volume / 1e6:.0f} MB at N=8 (2(N-1)/N x 4P)")
    return bench.finish(
        {
            "settings": {**common, "reps": bench.reps, "threads": 1, "model_args": MODEL_ARGS},
            "step_time_s": runs,
            "samples_per_s": {"1": one, "2": two},
            "speedup": two / one,
            "efficiency": efficiency,
            "model_params": params,
            "allreduce_s": allreduce_s,
            "projection": {
                "note": "PROJECTION, not measured",
                "params": big,
                "hop_latency_s": HOP_LATENCY_S,
                "backward_share": 2 / 3,
                "bucket_mib": 25,
                "efficiency_by_step_compute": projections,
            },
        },
        positive=[*rates["1 proc"], *rates["2 proc"]],
    )


def _side(
    nproc: int, *, steps: int, warmup: int, log_every: int, batch: int
) -> Callable[[], float]:
    def run() -> float:
        with harness.workdir(f"scaling-{nproc}") as work:
            argv = benchtask.trainbox_run(
                work, steps=steps, model_args=MODEL_ARGS, data_args=DATA_ARGS,
                extra=[f"train.batch_size={batch}", f"train.log_every={log_every}",
                       "train.amp=off", "preflight.gpus=off", "pinning.num_threads=1"],
            )  # fmt: skip
            # CPU even where GPUs are visible: this measures CPU processes.
            env = harness.clean_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
            harness.run(harness.torchrun(nproc, *argv), env)
            return harness.steady_step_time(harness.train_marks(work), warmup=warmup)

    return run


def allreduce_time(params: int) -> float:
    """Median seconds of one gloo all-reduce of `params` floats between 2 CPU processes."""
    argv = harness.torchrun(2, str(Path(__file__).resolve()), f"--allreduce-worker={params}")
    env = harness.clean_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return float(harness.result_of(argv, env)["seconds"])


def allreduce_worker(params: int, out: str) -> int:
    """One rank: time 10 all-reduces of `params` floats after 3 unmeasured ones."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.randn(params)
    times = []
    for index in range(13):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        if index >= 3:
            times.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"seconds": harness.median(times)}))
    dist.destroy_process_group()
    return 0


def allreduce_bytes(params: float, n: int, *, grad_bytes: int = 4) -> float:
    """Bytes each GPU sends (and receives) per step in a ring all-reduce of the gradients."""
    return 2 * (n - 1) / n * params * grad_bytes


def projected_efficiency(
    params: float,
    n: int,
    *,
    busbw_gb_per_s: float,
    step_compute_s: float,
    hop_latency_s: float = HOP_LATENCY_S,
    backward_share: float = 2 / 3,
    bucket_mib: float = 25.0,
    grad_bytes: int = 4,
) -> float:
    """PROJECTION: compute / (compute + exposed all-reduce) with DDP's bucket overlap."""
    if n <= 1:
        return 1.0
    buckets = max(1, math.ceil(params * grad_bytes / (bucket_mib * 2**20)))
    comm = allreduce_bytes(params, n, grad_bytes=grad_bytes) / (busbw_gb_per_s * 1e9)
    comm += buckets * 2 * (n - 1) * hop_latency_s
    backward = backward_share * step_compute_s
    # All buckets but the last overlap the backward pass; the last one is always exposed.
    exposed = max(comm / buckets, comm - backward * (buckets - 1) / buckets)
    return step_compute_s / (step_compute_s + exposed)


def project_table(params: float, step_compute_s: float) -> dict[str, dict[str, float]]:
    """Projected efficiency per assumed bus bandwidth and N."""
    return {
        f"{busbw:g} GB/s": {
            str(n): round(
                projected_efficiency(
                    params, n, busbw_gb_per_s=busbw, step_compute_s=step_compute_s
                ),
                3,
            )
            for n in PROJECTED_N
        }
        for busbw in BUSBW_GB_PER_S
    }


if __name__ == "__main__":
    raise SystemExit(main())
