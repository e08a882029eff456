"""Fleet health's cost: `trainbox run` with straggler detection and telemetry on (the defaults)
against the same run with both off, side by side.

    .venv/bin/python benchmarks/health_cost.py            # 7 repetitions per side
    .venv/bin/python benchmarks/health_cost.py --quick    # 1 short repetition (CI)
    .venv/bin/python benchmarks/health_cost.py --each     # also each part off alone

Both sides run under `torchrun --standalone --nproc-per-node 2` (gloo on CPU, nccl when GPUs
are visible) with benchtask's small MLP (~22k parameters), whose steps are so short that any
per-step cost shows; the config's default `train.log_every` (50), so the log point's larger
all-reduces count as often as they would in a real run; and `pinning.mode=off` with one thread
per process, as in trainer_overhead.py. What health adds: the step clock (three timestamps and a
gradient hook per step), the histograms and the MAX all-reduce at log points, and the sampler
thread (psutil here, NVML on GPUs). Steady state is the time between metrics.jsonl's `train`
lines past `--warmup` steps, divided by the steps between them.
Target: throughput with health on >= 0.99 of health off.
"""

from __future__ import annotations

import shutil

import benchtask
import sidebyside as sbs

TARGET_RATIO = 0.99
HEALTH_OFF = ("health.stragglers=false", "health.telemetry=false")
# --each: one part off at a time, to see which part a cost belongs to.
EACH_OFF = {"stragglers off": ("health.stragglers=false",),
            "telemetry off": ("health.telemetry=false",)}  # fmt: skip


def main() -> int:
    parse = sbs.parser(__doc__)
    parse.add_argument("--steps", type=int, default=0, help="steps per run (0: default)")
    parse.add_argument("--nproc", type=int, default=0, help="processes (0: 2, or 1 per GPU)")
    parse.add_argument("--each", action="store_true", help="add a side per part turned off")
    args = parse.parse_args()
    nproc = args.nproc or sbs.default_nproc()
    reps = args.reps or (1 if args.quick else 7)
    steps = args.steps or (300 if args.quick else 4000)
    warmup = 100 if args.quick else 500
    env = sbs.clean_env(OMP_NUM_THREADS="1")

    def side(extra: tuple[str, ...]) -> float:
        work = sbs.scratch("health-cost")
        try:
            argv = sbs.torchrun(
                nproc, "-m", "trainbox", "run", f"run_dir={work}", f"train.max_steps={steps}",
                "train.batch_size=64", "train.eval_every=0", "train.ckpt_every=0",
                "train.resume=never", "train.amp=off", "optim.weight_decay=0",
                "pinning.mode=off", "pinning.num_threads=1",
                *benchtask.overrides(benchtask.MODEL_ARGS, benchtask.DATA_ARGS), *extra,
            )  # fmt: skip
            sbs.run(argv, env)
            return sbs.steady_step_time(sbs.train_marks(work), warmup=warmup)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    runs = [("health on", lambda: side(())), ("health off", lambda: side(HEALTH_OFF))]
    if args.each:
        runs += [(name, lambda extra=extra: side(extra)) for name, extra in EACH_OFF.items()]
    sides = sbs.interleave(reps, runs, quiet=not args.quick)
    on, off = sides["health on"], sides["health off"]
    ratio = sbs.ratio(off, on)  # throughput ratio = inverse ratio of step times
    paired = [o / n for n, o in zip(on, off, strict=True)]
    cost_us = (sbs.median(on) - sbs.median(off)) * 1e6
    rows = [["side", "median step (us)", "runs (step us)"]]
    for name, times in sides.items():
        rows.append([name, sbs.median(times) * 1e6, " ".join(f"{t * 1e6:.0f}" for t in times)])
    print(sbs.table(rows))
    result = sbs.verdict(ratio >= TARGET_RATIO, quick=args.quick)
    print(f"throughput ratio health on/off: {ratio:.4f} (target >= {TARGET_RATIO}): {result}")
    print(f"cost: {cost_us:+.1f} us per step (median on - median off)")
    print(f"paired ratios (noise): {' '.join(f'{p:.3f}' for p in paired)}")
    for name in EACH_OFF if args.each else ():
        alone = (sbs.median(on) - sbs.median(sides[name])) * 1e6
        print(f"with {name}: {alone:+.1f} us per step less than health on")
    return sbs.finish(
        "health_cost",
        {
            "settings": {"steps": steps, "warmup": warmup, "reps": reps, "nproc": nproc,
                         "log_every": 50, "batch": 64, "threads": 1,
                         "model_args": benchtask.MODEL_ARGS},
            "step_time_s": sides,
            "throughput_ratio": ratio,
            "paired_ratios": paired,
            "cost_us_per_step": cost_us,
            "target": f"throughput ratio >= {TARGET_RATIO}",
            "result": result,
        },
        positive=[t for times in sides.values() for t in times],
        quick=args.quick,
        save=args.save,
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
