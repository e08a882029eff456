"""Fleet health's cost: training with straggler detection and telemetry on (the defaults)
against the same training with both off, side by side.

    .venv/bin/python benchmarks/health_cost.py              # both measurements, one job each
    .venv/bin/python benchmarks/health_cost.py --quick      # 1 short round of each (CI)
    .venv/bin/python benchmarks/health_cost.py --same       # A/A: health on against itself
    .venv/bin/python benchmarks/health_cost.py --each       # also each part off alone
    .venv/bin/python benchmarks/health_cost.py --whole-runs # a `trainbox run` per side instead

Both sides train benchtask's small MLP (~22k parameters) on 2 processes under
`torchrun --standalone` (gloo on CPU, nccl when GPUs are visible), one thread each. Every rank
calls `trainbox.Trainer(...).fit()` (the Python API, the same loop `trainbox run` drives,
sampler thread included) for one side, then the other, round after round, A B then B A, so both
sides share the processes and neither always goes first.

What health adds happens at log points: the parts' histograms in the SUM all-reduce, a second
(MAX) all-reduce, and decoding both into records. Per step it adds only the step clock (a few
clock readings and a gradient hook); its sampler thread wakes every 2 s, and on the CPU the
pause meter's thread every 50 ms. Three measurements:
  1. The log point's cost: rounds of 300 steps with `train.log_every=1`, so every step pays it.
     A round's two sides run back to back, so their difference is taken per round; the median
     of those differences is the cost of one log point.
  2. Directly at the default `train.log_every=50` (rounds of 1,500 steps). On a small shared
     machine this one is noisy: its CPUs' speed shifts for seconds at a time, so the same
     side's rounds differ by more than the 1 % judged (`--same` shows it; benchmarks/README.md
     has the figures).
  3. The pause meter's thread, which costs by the second, not by the log point: its CPU time
     (read from its own thread clock) over a span while this process trains benchtask's model,
     as a share of one CPU. A rank loses at most that share of its CPU to it.
The throughput ratio at the default is then step / (step + log point cost / 50 + share * step),
with step the health-off step time of measurement 2 (which counts the step clock once per 50
steps, not 50 times: an error too small to matter, sized in benchmarks/README.md). Steady state
is the median time per step between metrics.jsonl's `train` lines past the warm-up.
Target: throughput with health on >= 0.99 of health off, at the default log_every.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import benchtask
import harness

TARGET_RATIO = 0.99
HEALTH_OFF = ("health.stragglers=false", "health.telemetry=false")
# --each: one part off at a time, to see which part a cost belongs to.
EACH_OFF = {"stragglers off": ("health.stragglers=false",),
            "telemetry off": ("health.telemetry=false",)}  # fmt: skip
# Both sides' training, besides the run directory, the steps, log_every and TRAIN_ONLY.
COMMON = ("train.batch_size=64", "train.amp=off", "optim.weight_decay=0")


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """One measurement's rounds."""

    # train.log_every of every round.
    log_every: int
    # Steps per round.
    steps: int
    # Steps left out at the start of each round.
    warmup: int
    # Rounds per side.
    reps: int


def shapes(args: argparse.Namespace, *, reps: int) -> tuple[Shape, Shape]:
    """(the log point's measurement, the direct one at the default log_every, `reps` rounds)."""
    if args.quick:
        return (Shape(log_every=1, steps=100, warmup=50, reps=1),
                Shape(log_every=50, steps=300, warmup=100, reps=1))  # fmt: skip
    direct_steps = args.steps or (4000 if args.whole_runs else 1500)
    return (Shape(log_every=1, steps=300, warmup=50, reps=args.point_reps),
            Shape(log_every=50, steps=direct_steps, warmup=500, reps=reps))  # fmt: skip


def main() -> int:
    args = _parser().parse_args()
    if args.worker:
        return worker(args)
    bench = harness.start("health_cost", args, reps=7 if args.whole_runs else 12)
    nproc = args.nproc or harness.default_nproc()
    sides = sides_for(each=args.each, same=args.same)
    point, direct = shapes(args, reps=bench.reps)
    if args.whole_runs:
        direct_times = whole_runs(sides, nproc=nproc, shape=direct, pinning=args.pinning,
                                  quiet=not bench.quick)  # fmt: skip
    else:
        direct_times = in_one_job(sides, nproc=nproc, shape=direct)
    point_times = in_one_job(sides, nproc=nproc, shape=point)
    meter = meter_share(seconds=2.0 if bench.quick else 20.0)
    settings = {"direct": "whole runs" if args.whole_runs else "one job", "nproc": nproc,
                "log_point": dataclasses.asdict(point), "default": dataclasses.asdict(direct),
                "batch": 64, "threads": 1, "model_args": benchtask.MODEL_ARGS}  # fmt: skip
    if args.whole_runs:
        settings["pinning"] = args.pinning
    return report(point_times, direct_times, settings=settings, every=direct.log_every,
                  meter=meter, bench=bench)  # fmt: skip


def sides_for(*, each: bool, same: bool = False) -> dict[str, tuple[str, ...]]:
    """Each side's overrides: health on and off, and with `each` each part off alone; with
    `same`, health on twice (the method's own error: its ratio should come out 1)."""
    if same:
        return {"health on": (), "health on, again": ()}
    return {"health on": (), "health off": HEALTH_OFF, **(EACH_OFF if each else {})}


def _parser() -> argparse.ArgumentParser:
    parse = harness.parser(__doc__)
    parse.add_argument("--steps", type=int, default=0, help="steps per direct round (0: default)")
    parse.add_argument("--point-reps", type=int, default=30, help="log point rounds per side")
    parse.add_argument("--nproc", type=int, default=0, help="processes (0: 2, or 1 per GPU)")
    parse.add_argument("--each", action="store_true", help="add a side per part turned off")
    parse.add_argument("--same", action="store_true", help="A/A: health on against itself")
    parse.add_argument("--whole-runs", action="store_true", help="direct: a `trainbox run` each")
    parse.add_argument("--pinning", default="off", help="pinning.mode with --whole-runs (off)")
    # A rank of the one job (health_cost.py starts them): where to write, what to train.
    parse.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parse.add_argument("--out", default="", help=argparse.SUPPRESS)
    parse.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    parse.add_argument("--log-every", type=int, default=50, help=argparse.SUPPRESS)
    return parse


def in_one_job(
    sides: dict[str, tuple[str, ...]], *, nproc: int, shape: Shape
) -> dict[str, list[float]]:
    """Seconds per step of each side's rounds, all trained in turn by one torchrun job."""
    flags = ["--each"] if EACH_OFF.keys() & sides.keys() else []
    flags += ["--same"] if sides == sides_for(each=False, same=True) else []
    argv = harness.torchrun(
        nproc, __file__, "--worker", "--reps", str(shape.reps), "--steps", str(shape.steps),
        "--warmup", str(shape.warmup), "--log-every", str(shape.log_every), *flags,
    )  # fmt: skip
    times: dict[str, list[float]] = harness.result_of(
        argv, harness.clean_env(OMP_NUM_THREADS="1"), timeout=3600
    )
    return times


def worker(args: argparse.Namespace) -> int:
    """One rank of the one job: fit each side in turn, `--reps` rounds, their run directories
    beside OUT; rank 0 writes the steady seconds per step of every fit to OUT."""
    import torch

    import trainbox

    torch.set_num_threads(1)
    work = Path(args.out).parent
    sides = sides_for(each=args.each, same=args.same)
    times: dict[str, list[float]] = {name: [] for name in sides}
    with trainbox.init_distributed(timeout_s=300, seed=0) as session:
        rank0 = session.context.rank == 0
        for rep in range(args.reps):
            # Every other round the other way round (A B, B A, ...), so that whatever going first
            # does (the previous fit's leftovers, warm caches) falls on both sides alike.
            order = list(enumerate(sides.items()))
            for number, (name, extra) in order if rep % 2 == 0 else order[::-1]:
                run_dir = work / f"round-{rep}-side-{number}"
                overrides = [f"run_dir={run_dir}", f"train.max_steps={args.steps}", *COMMON,
                             *benchtask.TRAIN_ONLY,
                             f"train.log_every={args.log_every}"]  # fmt: skip
                config = trainbox.load_config(None, [*overrides, *extra])
                torch.manual_seed(config.seed)
                model = benchtask.model(**benchtask.MODEL_ARGS)
                data = benchtask.data(**benchtask.DATA_ARGS)
                trainbox.Trainer(config, session, model=model, data=data).fit()
                if rank0:
                    marks = harness.train_marks(run_dir)
                    times[name].append(harness.steady_step_time(marks, warmup=args.warmup))
                    shutil.rmtree(run_dir, ignore_errors=True)
                    print(f"  round {rep + 1}/{args.reps}: {name} {times[name][-1] * 1e6:.0f}"
                          " us per step", file=sys.stderr, flush=True)  # fmt: skip
    if rank0:
        Path(args.out).write_text(json.dumps(times))
    return 0


def meter_share(*, seconds: float) -> float:
    """The pause meter thread's CPU time as a share of one CPU, over `seconds` of this process
    training benchtask's model in one thread (the interpreter's lock changes hands as in a
    rank: the meter wakes while the training thread runs Python or torch)."""
    import torch

    from trainbox.health.pauses import PauseMeter

    torch.set_num_threads(1)
    model = benchtask.model(**benchtask.MODEL_ARGS)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(64, benchtask.MODEL_ARGS["in_features"])
    labels = torch.randint(0, benchtask.MODEL_ARGS["classes"], (64,))
    meter = PauseMeter(lambda: 0, phases=1)
    meter.start()
    (thread,) = [t for t in threading.enumerate() if t.name == "trainbox-pauses"]
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    try:
        cpu, started = time.clock_gettime(clock), time.perf_counter()
        while time.perf_counter() - started < seconds:
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        share = (time.clock_gettime(clock) - cpu) / (time.perf_counter() - started)
    finally:
        meter.stop()
    print(f"  pause meter: {share * 100:.3f} % of one CPU", file=sys.stderr, flush=True)
    return share


def whole_runs(
    sides: dict[str, tuple[str, ...]], *, nproc: int, shape: Shape, pinning: str, quiet: bool
) -> dict[str, list[float]]:
    """Seconds per step of each side's separate `trainbox run`s, taken in turn."""
    env = harness.clean_env(OMP_NUM_THREADS="1")

    def side(extra: tuple[str, ...]) -> float:
        with harness.workdir("health-cost") as work:
            run = benchtask.trainbox_run(
                work, steps=shape.steps,
                extra=[f"train.log_every={shape.log_every}", *COMMON, f"pinning.mode={pinning}",
                       "pinning.num_threads=1", *extra],
            )  # fmt: skip
            harness.run(harness.torchrun(nproc, *run), env)
            return harness.steady_step_time(harness.train_marks(work), warmup=shape.warmup)

    runs: list[tuple[str, Callable[[], float]]] = [
        (name, functools.partial(side, extra)) for name, extra in sides.items()
    ]
    return harness.interleave(shape.reps, runs, quiet=quiet)


def report(
    point: dict[str, list[float]], direct: dict[str, list[float]], *,
    settings: dict[str, object], every: int, meter: float, bench: harness.Bench,
) -> int:  # fmt: skip
    """Print the measurements, the ratio they give at the default log_every and each part's
    share; the JSON line."""
    (on_name, on), (off_name, off) = list(direct.items())[:2]
    # With log_every=1 a step's time holds one log point: a round's difference is its cost.
    costs = [n - o for n, o in zip(point[on_name], point[off_name], strict=True)]
    cost_s = harness.median(costs)
    cost_low, cost_high = harness.median_interval(costs)
    step_s = harness.median(off)

    def at_default(cost: float) -> float:
        return step_s / (step_s + cost / every + meter * step_s)

    ratio, low, high = at_default(cost_s), at_default(cost_high), at_default(cost_low)
    paired = [o / n for n, o in zip(on, off, strict=True)]
    direct_ratio = harness.median(paired)
    direct_low, direct_high = harness.median_interval(paired)
    rows: list[list[object]] = [["side", "log_every=1 (us/step)", f"log_every={every}", "rounds"]]
    for name in direct:
        shown = harness.spread(t * 1e6 for t in direct[name][:12])
        rows.append(
            [name, harness.median(point[name]) * 1e6, harness.median(direct[name]) * 1e6, shown]
        )
    print(harness.table(rows))
    print(
        f"one log point's cost ({on_name} - {off_name}, median of {len(costs)} rounds):"
        f" {cost_s * 1e6:+.0f} us (90% interval {cost_low * 1e6:+.0f} to {cost_high * 1e6:+.0f})"
    )
    print(f"the pause meter's thread: {meter * 100:.3f} % of one CPU")
    result = bench.verdict(low >= TARGET_RATIO)
    print(
        f"throughput ratio at log_every={every} ({step_s * 1e6:.0f} us steps, both):"
        f" {ratio:.4f} (90% interval {low:.4f} to {high:.4f}; target >= {TARGET_RATIO}): {result}"
    )
    print(
        f"measured directly at log_every={every}, median of {len(paired)} rounds:"
        f" {direct_ratio:.4f} (90% interval {direct_low:.4f} to {direct_high:.4f}: noise)"
    )
    for name in list(direct)[2:]:
        alone = harness.median([n - o for n, o in zip(point[on_name], point[name], strict=True)])
        print(f"with {name}: the log point costs {alone * 1e6:+.0f} us less than health on")
    return bench.finish(
        {
            "settings": settings,
            "log_point_step_time_s": point,
            "step_time_s": direct,
            "log_point_cost_us": cost_s * 1e6,
            "log_point_cost_interval_90_us": [cost_low * 1e6, cost_high * 1e6],
            "pause_meter_cpu_share": meter,
            "throughput_ratio": ratio,
            "ratio_interval_90": [low, high],
            "direct_throughput_ratio": direct_ratio,
            "direct_ratio_interval_90": [direct_low, direct_high],
            "target": f"throughput ratio >= {TARGET_RATIO} at log_every={every}",
            "result": result,
        },
        positive=[t for times in (*point.values(), *direct.values()) for t in times],
    )


if __name__ == "__main__":
    raise SystemExit(main())
