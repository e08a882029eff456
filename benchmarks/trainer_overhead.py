"""Trainer overhead: `trainbox run` against a minimal hand-written DDP loop, side by side.

    .venv/bin/python benchmarks/trainer_overhead.py            # 5 repetitions per side
    .venv/bin/python benchmarks/trainer_overhead.py --quick    # 1 short repetition (CI)

Both sides run under `torchrun --standalone --nproc-per-node 2` (gloo on CPU, nccl when GPUs
are visible) with the same small MLP (benchtask, ~22k parameters), the same samples and
sampler, per-process batch 64, AdamW, the same number of steps and one intra-op thread per
process. trainbox writes its metrics line (an all-reduce of the loss, a metrics.jsonl line and a
log line) every `--log-every` steps; the raw loop logs nothing. Steady state is the time from
the mark at `--warmup` steps to the last mark, divided by the steps between: for trainbox the
`time` of its metrics.jsonl lines, for the raw loop the times it records at the same steps.

trainbox runs with pinning.mode=off by default, so that the ratio is the training loop's alone
(pinning has its own benchmark: data_pinning.py); `--pinning auto` measures it as shipped.
`--without-vote` adds a third side, a diagnosis: trainbox with its stop vote (the all-reduce
that lets every rank stop after the same step on a signal) all but off, `dist.vote_every_s` at
its maximum (one vote a minute); `--vote-every S` adds trainbox with `dist.vote_every_s=S` (the
vote's period, a stop-latency/throughput trade-off). Where each side's step goes:
step_pieces.py (`--nproc 2` for this benchmark's two ranks).
`--frameworks` adds the same loop written with Lightning Fabric, Accelerate and Lightning's
Trainer (framework_loops.py), each a side of its own, with its ratio to the raw loop
(`--frameworks fabric` for one); `--quick` runs Fabric's side alone.
`--against-src DIR` adds trainbox from another checkout's `src/` (say, the commit before a
change) as a side of its own, so a regression shows as a ratio measured in the same run:
    git worktree add /tmp/before HEAD~1
    .venv/bin/python benchmarks/trainer_overhead.py --against-src /tmp/before/src
Target: steady-state throughput ratio trainbox/raw >= 0.98.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import benchtask
import harness

TARGET_RATIO = 0.98
# The side of --against-src.
AGAINST = "trainbox (other src)"
# --without-vote's side: the longest period between stop votes that the config allows, so a
# run of this benchmark's length votes about once (a public setting; nothing is patched).
RAREST_VOTE = "dist.vote_every_s=60"
RARE_VOTE_SIDE = "trainbox, vote every 60 s"
# --frameworks' sides: framework_loops.py's --framework value and the side's name.
FRAMEWORKS = {"fabric": "Fabric", "accelerate": "Accelerate", "lightning": "Lightning Trainer"}


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--steps", type=int, default=0, help="steps per run (0: default)")
    parse.add_argument("--batch-size", type=int, default=64)
    parse.add_argument("--log-every", type=int, default=50)
    parse.add_argument("--pinning", default="off", choices=("off", "auto"))
    parse.add_argument("--nproc", type=int, default=0, help="processes (0: 2, or 1 per GPU)")
    parse.add_argument("--without-vote", action="store_true", help="add a diagnostic third side")
    parse.add_argument("--vote-every", type=float, default=0.0, help="add a side voting every S s")
    parse.add_argument("--against-src", default="", help="add trainbox from this src/ as a side")
    parse.add_argument(
        "--frameworks",
        nargs="?",
        const=",".join(FRAMEWORKS),
        default="",
        metavar="NAMES",
        help=f"add these libraries' loops (default: all of {','.join(FRAMEWORKS)})",
    )
    args = parse.parse_args()
    nproc = args.nproc or harness.default_nproc()
    bench = harness.start("trainer_overhead", args, reps=5)
    steps = args.steps or (300 if args.quick else 3000)
    warmup = 100 if args.quick else 500
    common = {"steps": steps, "batch": args.batch_size, "log_every": args.log_every, "nproc": nproc}
    sides = interleaved(
        bench,
        warmup=warmup,
        pinning=args.pinning,
        without_vote=args.without_vote,
        vote_every_s=args.vote_every,
        against_src=args.against_src,
        # Quick mode (CI) runs Fabric's side, so that framework_loops.py cannot rot unseen;
        # the other two would add half a minute of start-up to a suite near its limit.
        frameworks=chosen_frameworks(args.frameworks or ("fabric" if args.quick else "")),
        **common,
    )
    tb, raw = sides["trainbox"], sides["raw"]
    global_batch = args.batch_size * nproc
    ratio = harness.ratio(raw, tb)  # throughput ratio = inverse ratio of step times
    # Each repetition's pair ran back to back: their spread shows how noisy the machine was.
    paired = [r / t for t, r in zip(tb, raw, strict=True)]
    overhead_us = (harness.median(tb) - harness.median(raw)) * 1e6
    rows = [["side", "median step (us)", "samples/s", "runs (step us)"]]
    for name, times in sides.items():
        median = harness.median(times)
        rows.append([name, median * 1e6, global_batch / median,
                     harness.spread(t * 1e6 for t in times)])  # fmt: skip
    print(harness.table(rows))
    result = bench.judge("throughput ratio trainbox/raw", ratio, at_least=TARGET_RATIO, shown=".4f")
    print(f"per-step overhead: {overhead_us:+.1f} us per step (median trainbox - median raw)")
    print(f"paired ratios (noise): {harness.spread(paired, '.3f')}")
    if args.without_vote:
        bare = sides[RARE_VOTE_SIDE]
        print(
            f"with the vote all but off: ratio {harness.ratio(raw, bare):.4f}, overhead"
            f" {(harness.median(bare) - harness.median(raw)) * 1e6:+.1f} us per step;"
            " the vote costs"
            f" {(harness.median(tb) - harness.median(bare)) * 1e6:+.1f} us per step"
        )
    if args.vote_every:
        slower = sides[voting(args.vote_every)]
        print(
            f"voting every {args.vote_every:g} s: ratio {harness.ratio(raw, slower):.4f}, overhead"
            f" {(harness.median(slower) - harness.median(raw)) * 1e6:+.1f} us per step"
        )
    if args.frameworks or args.quick:
        print("steps/s against the raw loop: " + ", ".join(
            f"{name} {harness.ratio(raw, sides[name]):.3f}"
            for name in ("trainbox", *FRAMEWORKS.values()) if name in sides
        ))  # fmt: skip
    if args.against_src:
        other = sides[AGAINST]
        print(
            f"against {args.against_src}: its ratio to raw {harness.ratio(raw, other):.4f}; this"
            f" checkout / that one: {harness.ratio(other, tb):.4f} (throughput, 1.0 = no change)"
        )
    return bench.finish(
        {
            "settings": {
                **common, "warmup": warmup, "reps": bench.reps, "threads": 1,
                "pinning": args.pinning, "model_args": benchtask.MODEL_ARGS,
            },
            "step_time_s": sides,
            "throughput_ratio": ratio,
            "paired_ratios": paired,
            # Negative when trainbox was faster (noise, or pinning with --pinning auto).
            "overhead_us_per_step": overhead_us,
            "target": f"throughput ratio >= {TARGET_RATIO}",
            "result": result,
        },
        positive=[t for times in sides.values() for t in times],
    )  # fmt: skip


def interleaved(
    bench: harness.Bench,
    *,
    nproc: int,
    steps: int,
    batch: int,
    log_every: int,
    warmup: int,
    pinning: str,
    without_vote: bool = False,
    vote_every_s: float = 0.0,
    against_src: str = "",
    frameworks: list[str],
) -> dict[str, list[float]]:
    """Steady-state seconds per step of each run, trainbox and raw alternating."""
    env = harness.clean_env(OMP_NUM_THREADS="1")

    def trainbox(src: str = "", extra: tuple[str, ...] = ()) -> float:
        with harness.workdir("overhead-tb") as work:
            run = benchtask.trainbox_run(
                work, steps=steps,
                extra=[f"train.batch_size={batch}", f"train.log_every={log_every}",
                       "train.amp=off", "optim.weight_decay=0", f"pinning.mode={pinning}",
                       "pinning.num_threads=1", *extra],
            )  # fmt: skip
            # Another checkout's src/ first on the path: its trainbox is the one imported.
            paths = f"{src}{os.pathsep}{env['PYTHONPATH']}" if src else env["PYTHONPATH"]
            harness.run(harness.torchrun(nproc, *run), {**env, "PYTHONPATH": paths})
            return harness.steady_step_time(harness.train_marks(work), warmup=warmup)

    def raw() -> float:
        options = [f"--batch-size={batch}", f"--log-every={log_every}"]
        loop = benchtask.raw_loop(steps=steps, extra=options)
        found = harness.result_of(harness.torchrun(nproc, *loop), env)
        return harness.steady_step_time([tuple(m) for m in found["marks"]], warmup=warmup)

    def framework(name: str) -> float:
        options = [f"--batch-size={batch}", f"--log-every={log_every}", f"--framework={name}"]
        loop = benchtask.raw_loop(steps=steps, extra=options, script="framework_loops.py")
        found = harness.result_of(harness.torchrun(nproc, *loop), env)
        return harness.steady_step_time([tuple(m) for m in found["marks"]], warmup=warmup)

    runs: list[tuple[str, Callable[[], float]]] = [("trainbox", trainbox), ("raw", raw)]
    runs += [(FRAMEWORKS[name], lambda name=name: framework(name)) for name in frameworks]
    if without_vote:
        runs.append((RARE_VOTE_SIDE, lambda: trainbox(extra=(RAREST_VOTE,))))
    if vote_every_s:
        period = (f"dist.vote_every_s={vote_every_s}",)
        runs.append((voting(vote_every_s), lambda: trainbox(extra=period)))
    if against_src:
        runs.append((AGAINST, lambda: trainbox(src=against_src)))
    return bench.rounds(runs)


def chosen_frameworks(names: str) -> list[str]:
    """The --frameworks list, checked: framework_loops.py's names, comma-separated."""
    chosen = [name for name in names.split(",") if name]
    unknown = sorted(set(chosen) - set(FRAMEWORKS))
    if unknown:
        raise SystemExit(f"--frameworks {','.join(unknown)}: choose from {','.join(FRAMEWORKS)}")
    return chosen


def voting(every_s: float) -> str:
    """The name of the --vote-every side."""
    return f"trainbox, vote every {every_s:g} s"


if __name__ == "__main__":
    raise SystemExit(main())
