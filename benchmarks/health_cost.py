"""Fleet health's cost: training with straggler detection and telemetry on (the defaults)
against the same training with both off, side by side.

    .venv/bin/python benchmarks/health_cost.py              # one job, 12 rounds of each side
    .venv/bin/python benchmarks/health_cost.py --quick      # 2 short rounds (CI)
    .venv/bin/python benchmarks/health_cost.py --each       # also each part off alone
    .venv/bin/python benchmarks/health_cost.py --whole-runs # a `trainbox run` per side instead

Both sides train benchtask's small MLP (~22k parameters) on 2 processes under
`torchrun --standalone` (gloo on CPU, nccl when GPUs are visible), one thread each, with the
config's default `train.log_every` (50), so the log point's larger all-reduces count as often
as they would in a real run. The MLP's steps are so short that any per-step cost shows. What
health adds: the step clock (three timestamps and a gradient hook per step), the histograms and
the MAX all-reduce at log points, and the sampler thread (psutil here, NVML on GPUs).

By default the sides take turns inside one job: every rank calls `trainbox.Trainer(...).fit()`
(the Python API, the same loop `trainbox run` drives, sampler thread included) for one side,
then the other, round after round. On a small shared machine two separate runs of the same
config differ by 5-15 % (where the processes land, what the neighbours do), far more than the
1 % this judges; in one job both sides share the processes, so that difference cancels.
`--whole-runs` starts one `trainbox run` per side instead, as the user does (CLI, pinning,
start-up included), and shows that noise. Steady state is the median time per step between
metrics.jsonl's `train` lines past `--warmup` steps.
Target: throughput with health on >= 0.99 of health off.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import benchtask
import sidebyside as sbs

TARGET_RATIO = 0.99
HEALTH_OFF = ("health.stragglers=false", "health.telemetry=false")
# --each: one part off at a time, to see which part a cost belongs to.
EACH_OFF = {"stragglers off": ("health.stragglers=false",),
            "telemetry off": ("health.telemetry=false",)}  # fmt: skip
# Both sides' training, besides the run directory and the steps.
COMMON = ("train.batch_size=64", "train.eval_every=0", "train.ckpt_every=0",
          "train.resume=never", "train.amp=off", "optim.weight_decay=0")  # fmt: skip


def main() -> int:
    args = _parser().parse_args()
    if args.worker:
        return worker(args)
    nproc = args.nproc or sbs.default_nproc()
    reps = args.reps or (2 if args.quick else 12 if not args.whole_runs else 7)
    default_steps = 1500 if not args.whole_runs else 4000
    steps = args.steps or (300 if args.quick else default_steps)
    warmup = 100 if args.quick else 500
    sides = sides_for(each=args.each)
    shape = {"nproc": nproc, "reps": reps, "steps": steps, "warmup": warmup}
    if args.whole_runs:
        times = whole_runs(sides, **shape, pinning=args.pinning, quiet=not args.quick)
    else:
        times = in_one_job(sides, **shape)
    settings = {"mode": "whole runs" if args.whole_runs else "one job", "steps": steps,
                "warmup": warmup, "reps": reps, "nproc": nproc, "log_every": 50, "batch": 64,
                "threads": 1, "model_args": benchtask.MODEL_ARGS}  # fmt: skip
    if args.whole_runs:
        settings["pinning"] = args.pinning
    return report(times, settings=settings, quick=args.quick, save=args.save)


def sides_for(*, each: bool) -> dict[str, tuple[str, ...]]:
    """Each side's overrides: health on and off, and with `each` each part off alone."""
    return {"health on": (), "health off": HEALTH_OFF, **(EACH_OFF if each else {})}


def _parser() -> argparse.ArgumentParser:
    parse = sbs.parser(__doc__)
    parse.add_argument("--steps", type=int, default=0, help="steps per run (0: default)")
    parse.add_argument("--nproc", type=int, default=0, help="processes (0: 2, or 1 per GPU)")
    parse.add_argument("--each", action="store_true", help="add a side per part turned off")
    parse.add_argument("--whole-runs", action="store_true", help="one `trainbox run` per side")
    parse.add_argument("--pinning", default="off", help="pinning.mode with --whole-runs (off)")
    # A rank of the one job (health_cost.py starts them): where to write, which sides.
    parse.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parse.add_argument("--work", default="", help=argparse.SUPPRESS)
    parse.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    return parse


def in_one_job(
    sides: dict[str, tuple[str, ...]], *, nproc: int, reps: int, steps: int, warmup: int
) -> dict[str, list[float]]:
    """Seconds per step of each side's rounds, all trained in turn by one torchrun job."""
    work = sbs.scratch("health-cost")
    try:
        each = ["--each"] if EACH_OFF.keys() & sides.keys() else []
        argv = sbs.torchrun(
            nproc, __file__, "--worker", "--work", str(work), "--reps", str(reps),
            "--steps", str(steps), "--warmup", str(warmup), *each,
        )  # fmt: skip
        sbs.run(argv, sbs.clean_env(OMP_NUM_THREADS="1"), timeout=3600)
        times: dict[str, list[float]] = json.loads((work / "times.json").read_text())
        return times
    finally:
        shutil.rmtree(work, ignore_errors=True)


def worker(args: argparse.Namespace) -> int:
    """One rank of the one job: fit each side in turn, `--reps` rounds; rank 0 writes the
    steady seconds per step of every fit to WORK/times.json."""
    import torch

    import trainbox

    torch.set_num_threads(1)
    work = Path(args.work)
    sides = sides_for(each=args.each)
    times: dict[str, list[float]] = {name: [] for name in sides}
    with trainbox.init_distributed(timeout_s=300, seed=0) as session:
        rank0 = session.context.rank == 0
        for rep in range(args.reps):
            for number, (name, extra) in enumerate(sides.items()):
                run_dir = work / f"round-{rep}-side-{number}"
                overrides = [f"run_dir={run_dir}", f"train.max_steps={args.steps}", *COMMON]
                config = trainbox.load_config(None, [*overrides, *extra])
                torch.manual_seed(config.seed)
                model = benchtask.model(**benchtask.MODEL_ARGS)
                data = benchtask.data(**benchtask.DATA_ARGS)
                trainbox.Trainer(config, session, model=model, data=data).fit()
                if rank0:
                    marks = sbs.train_marks(run_dir)
                    times[name].append(sbs.steady_step_time(marks, warmup=args.warmup))
                    shutil.rmtree(run_dir, ignore_errors=True)
                    print(f"  round {rep + 1}/{args.reps}: {name} {times[name][-1] * 1e6:.0f}"
                          " us per step", file=sys.stderr, flush=True)  # fmt: skip
    if rank0:
        (work / "times.json").write_text(json.dumps(times))
    return 0


def whole_runs(
    sides: dict[str, tuple[str, ...]], *, nproc: int, reps: int, steps: int, warmup: int,
    pinning: str, quiet: bool,
) -> dict[str, list[float]]:  # fmt: skip
    """Seconds per step of each side's separate `trainbox run`s, taken in turn."""
    env = sbs.clean_env(OMP_NUM_THREADS="1")

    def side(extra: tuple[str, ...]) -> float:
        work = sbs.scratch("health-cost")
        try:
            argv = sbs.torchrun(
                nproc, "-m", "trainbox", "run", f"run_dir={work}", f"train.max_steps={steps}",
                *COMMON, f"pinning.mode={pinning}", "pinning.num_threads=1",
                *benchtask.overrides(benchtask.MODEL_ARGS, benchtask.DATA_ARGS), *extra,
            )  # fmt: skip
            sbs.run(argv, env)
            return sbs.steady_step_time(sbs.train_marks(work), warmup=warmup)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    runs: list[tuple[str, Callable[[], float]]] = [
        (name, functools.partial(side, extra)) for name, extra in sides.items()
    ]
    return sbs.interleave(reps, runs, quiet=quiet)


def report(
    sides: dict[str, list[float]], *, settings: dict[str, object], quick: bool, save: bool
) -> int:
    """Print the table, the ratio with its noise and each part's share; the JSON line."""
    on, off = sides["health on"], sides["health off"]
    ratio = sbs.ratio(off, on)  # throughput ratio = inverse ratio of step times
    low, high = sbs.ratio_interval(off, on)
    paired = [o / n for n, o in zip(on, off, strict=True)]
    cost_us = (sbs.median(on) - sbs.median(off)) * 1e6
    rows: list[list[object]] = [["side", "median step (us)", "runs (step us)"]]
    for name, times in sides.items():
        rows.append([name, sbs.median(times) * 1e6, " ".join(f"{t * 1e6:.0f}" for t in times)])
    print(sbs.table(rows))
    result = sbs.verdict(ratio >= TARGET_RATIO, quick=quick)
    print(f"throughput ratio health on/off: {ratio:.4f} (target >= {TARGET_RATIO}): {result}")
    print(f"90% bootstrap interval of that ratio (noise): {low:.4f} to {high:.4f}")
    print(f"cost: {cost_us:+.1f} us per step (median on - median off)")
    print(f"paired ratios (noise): {' '.join(f'{p:.3f}' for p in paired)}")
    for name in [name for name in sides if name not in ("health on", "health off")]:
        alone = (sbs.median(on) - sbs.median(sides[name])) * 1e6
        print(f"with {name}: {alone:+.1f} us per step less than health on")
    return sbs.finish(
        "health_cost",
        {
            "settings": settings,
            "step_time_s": sides,
            "throughput_ratio": ratio,
            "ratio_interval_90": [low, high],
            "paired_ratios": paired,
            "cost_us_per_step": cost_us,
            "target": f"throughput ratio >= {TARGET_RATIO}",
            "result": result,
        },
        positive=[t for times in sides.values() for t in times],
        quick=quick,
        save=save,
    )


if __name__ == "__main__":
    raise SystemExit(main())
