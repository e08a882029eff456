"""FSDP against DDP: peak RSS per rank and steps/s at 1, 2 and 4 ranks, on one model.

    .venv/bin/python benchmarks/fsdp_memory.py            # ~67M parameters, 1, 2 and 4 ranks
    .venv/bin/python benchmarks/fsdp_memory.py --quick    # a tiny model, 2 ranks (CI)

Three sides at each world size W, alternated: `trainbox run` with train.strategy=ddp, with
train.strategy=fsdp, and a raw FSDP2 loop written as PyTorch's docs show it (raw_fsdp.py). Every
rank runs under rss_probe.py, which records its peak RSS. The model is benchtask's MLP, big
enough that its state dominates: parameters + gradients + AdamW's two moments are 16 bytes a
parameter in fp32, all of it on every rank under DDP and 1/W of it under FSDP. The table sets
the measured peaks beside that theory, and the measured DDP - FSDP saving beside the theory's
16 P (1 - 1/W): the process's own baseline (Python, torch) cancels out of the difference.
FSDP also holds one unit's gathered parameters (and their gradients) while it runs: the largest
Linear here, which the theory leaves out.

`--mmap-threshold 65536` runs every rank with glibc's MALLOC_MMAP_THRESHOLD_ fixed at 64 KiB, so
freed large buffers (FSDP's per-unit gathers and gradient buffers, made and freed every step)
go back to the system instead of staying in the heap: with glibc's adaptive default the peak
RSS counts them, and FSDP's saving does not show on the CPU.

One intra-op thread per rank, gloo on CPU: steps/s at W > 2 share this machine's CPUs, so they
compare the sides with each other, not with a real cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchtask
import harness

HERE = Path(__file__).resolve().parent
FULL = {"in_features": 256, "classes": 10, "hidden": 2048, "layers": 16}
TINY = {"in_features": 32, "classes": 10, "hidden": 256, "layers": 4}
# Bytes per parameter: fp32 weight, gradient and AdamW's two moments.
STATE_BYTES = 16
MIB = 2**20
Result = dict[str, Any]


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument(
        "--mmap-threshold", type=int, metavar="BYTES",
        help="glibc's MALLOC_MMAP_THRESHOLD_ in every rank (default: glibc's own)",
    )  # fmt: skip
    args = parse.parse_args()
    bench = harness.start("fsdp_memory", args, reps=1)
    model_args = TINY if args.quick else FULL
    # Quick (CI): two ranks only, the smallest world where sharding shows.
    worlds = (2,) if args.quick else (1, 2, 4)
    steps, warmup, log_every = (6, 2, 2) if args.quick else (25, 5, 5)
    data_args = {"size": 1024, "in_features": model_args["in_features"], "classes": 10}
    setting = {"steps": steps, "warmup": warmup, "log_every": log_every, "batch": 8,
               "model": model_args, "data": data_args,
               "mmap_threshold": args.mmap_threshold}  # fmt: skip
    sides = [
        (f"{name} W={world}", side(name, world, setting))
        for world in worlds
        for name in ("ddp", "fsdp", "raw fsdp")
    ]
    runs = bench.rounds(sides)
    params = sum(p.numel() for p in benchtask.model(**model_args).parameters())
    summary = summarize(runs, params, worlds)
    print(report(summary, params))
    positive = [v for row in summary.values() for v in (row["peak_rss_mib"], row["steps_per_s"])]
    results = {"settings": {**setting, "reps": bench.reps, "threads": 1}, "params": params,
               "runs": runs, "summary": summary}  # fmt: skip
    return bench.finish(results, positive=positive)


def side(name: str, world: int, setting: dict[str, Any]) -> Callable[[], Result]:
    """One run of side `name` at `world` ranks: every rank's peak RSS and the steady steps/s."""

    def run() -> Result:
        with harness.workdir(f"fsdp-memory-{world}") as work:
            probe = [str(HERE / "rss_probe.py"), str(work)]
            program = raw(work, setting) if name == "raw fsdp" else trainbox(name, work, setting)
            env = harness.clean_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
            if setting["mmap_threshold"] is not None:
                env["MALLOC_MMAP_THRESHOLD_"] = str(setting["mmap_threshold"])
            harness.run(harness.torchrun(world, *probe, *program), env)
            peaks = [json.loads((work / f"rank-{r}.json").read_text())["peak_rss_mib"]
                     for r in range(world)]  # fmt: skip
            marks = (
                [tuple(m) for m in json.loads((work / "marks.json").read_text())["marks"]]
                if name == "raw fsdp"
                else harness.train_marks(work / "run")
            )
            step_s = harness.steady_step_time(marks, warmup=setting["warmup"])
            return {"peak_rss_mib": peaks, "steps_per_s": 1 / step_s}

    return run


def trainbox(strategy: str, work: Path, setting: dict[str, Any]) -> list[str]:
    """`-m trainbox run ...` with the strategy, no evaluation, no checkpoints."""
    return benchtask.trainbox_run(
        work / "run", steps=setting["steps"], model_args=setting["model"],
        data_args=setting["data"],
        extra=[f"train.strategy={strategy}", f"train.batch_size={setting['batch']}",
               f"train.log_every={setting['log_every']}", "train.amp=off", "preflight.gpus=off",
               "pinning.num_threads=1"],
    )  # fmt: skip


def raw(work: Path, setting: dict[str, Any]) -> list[str]:
    """raw_fsdp.py with the same model, data, batch and steps."""
    return benchtask.raw_loop(
        steps=setting["steps"], model_args=setting["model"], data_args=setting["data"],
        script="raw_fsdp.py",
        extra=[f"--batch-size={setting['batch']}", f"--log-every={setting['log_every']}",
               f"--out={work / 'marks.json'}"],
    )  # fmt: skip


def summarize(runs: dict[str, list[Result]], params: int, worlds: tuple[int, ...]) -> Result:
    """Per side: the median over runs of the largest rank's peak RSS and of steps/s, and theory."""
    summary = {}
    for name, results in runs.items():
        world = int(name.rsplit("=", 1)[1])
        sharded = not name.startswith("ddp")
        summary[name] = {
            "peak_rss_mib": harness.median(max(r["peak_rss_mib"]) for r in results),
            "peak_rss_mib_per_rank": [harness.median(vs) for vs in
                                      zip(*(r["peak_rss_mib"] for r in results), strict=True)],
            "steps_per_s": harness.median(r["steps_per_s"] for r in results),
            "theory_state_mib": STATE_BYTES * params / (world if sharded else 1) / MIB,
        }  # fmt: skip
    for world in worlds:
        ddp, fsdp = summary[f"ddp W={world}"], summary[f"fsdp W={world}"]
        fsdp["saving_mib"] = ddp["peak_rss_mib"] - fsdp["peak_rss_mib"]
        fsdp["theory_saving_mib"] = STATE_BYTES * params * (1 - 1 / world) / MIB
        fsdp["steps_per_s_vs_ddp"] = fsdp["steps_per_s"] / ddp["steps_per_s"]
        fsdp["steps_per_s_vs_raw"] = (
            fsdp["steps_per_s"] / summary[f"raw fsdp W={world}"]["steps_per_s"]
        )
    return summary


def report(summary: Result, params: int) -> str:
    """The table, and a line on what the theory counts."""
    rows = [["side", "peak RSS/rank MiB (max)", "per rank", "theory state/rank MiB",
             "DDP-FSDP saved MiB", "theory saved", "steps/s", "fsdp/ddp", "fsdp/raw"]]  # fmt: skip
    for name, row in summary.items():
        rows.append([
            name, row["peak_rss_mib"], harness.spread(row["peak_rss_mib_per_rank"]),
            row["theory_state_mib"], row.get("saving_mib", ""), row.get("theory_saving_mib", ""),
            row["steps_per_s"], row.get("steps_per_s_vs_ddp", ""),
            row.get("steps_per_s_vs_raw", ""),
        ])  # fmt: skip
    return (
        f"{params / 1e6:.1f}M parameters; theory = {STATE_BYTES} bytes a parameter (fp32 weight,"
        " gradient, AdamW's two moments), / W under FSDP\n" + harness.table(rows)
    )


if __name__ == "__main__":
    raise SystemExit(main())
