"""Where a step's time goes, trainbox's loop against the raw DDP loop, by Python function.

    .venv/bin/python benchmarks/step_pieces.py              # 3 interleaved repetitions
    .venv/bin/python benchmarks/step_pieces.py --quick      # 1 short one (CI)
    .venv/bin/python benchmarks/step_pieces.py --nproc 2    # 2 ranks each, rank 0 profiled

step_overhead.py and trainer_overhead.py say how much longer trainbox's step is; this says
where. Both sides run as trainer_overhead.py runs them: `trainbox run` and raw_ddp.py under
torchrun, benchtask's model and data, the same batch, AdamW, one thread. Each runs under
pyprofile.py: torch.profiler's Python tracer over steady-state steps of rank 0, stepped by
torch's public optimizer hook. Nothing is patched: no name inside trainbox is used, so the
loop can be rewritten freely and this still measures it.

Three tables, in µs per step (median over repetitions), trainbox then raw:
  pieces     the step, and the inclusive time of what both loops call: the next batch, DDP's
             forward, cross_entropy, backward (with the gradient all-reduce's wait), the
             optimizer step and zero_grad (torch's own function names and annotations)
  owners     self time summed by where the function lives: trainbox, torch.nn, torch.optim, ...;
             a C function's (a torch op's) time goes to its Python caller
  functions  the functions with the most self time on either side
The tracer costs time in every Python call, so steps are slower than unprofiled and the side
making more Python calls per step (printed) reads higher: read where the time goes, not how
much the step takes (that is trainer_overhead.py's job). Reports; judges no target.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import benchtask
import harness
import pyprofile

SIDES = ("trainbox", "raw")
# Not part of the step's time: what other threads (the watchdog, the stop vote) ran meanwhile.
OTHER_THREADS = "other threads' Python code (beside the step)"


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--nproc", type=int, default=1, help="ranks per side (rank 0 profiled)")
    parse.add_argument("--batch-size", type=int, default=64)
    parse.add_argument("--top", type=int, default=25, help="functions shown")
    args = parse.parse_args()
    bench = harness.start("step_pieces", args, reps=3)
    # Steps skipped (start-up, then the steady state's first ones) and steps profiled.
    skip, active = (60, 40) if args.quick else (500, 300)
    steps = skip + pyprofile.WARMUP + active + 20
    settings = {"nproc": args.nproc, "batch": args.batch_size, "steps": steps, "skip": skip,
                "profiled": active, "reps": bench.reps,
                "model_args": benchtask.MODEL_ARGS}  # fmt: skip
    runs = bench.rounds(
        [(side, lambda side=side: _profiled(side, args.nproc, args.batch_size, steps, skip, active))
         for side in SIDES]
    )  # fmt: skip
    pieces = _rows(runs, lambda r: {"step": r["step_ns"], **r["inclusive_ns"]})
    owners = _rows(runs, lambda r: {**r["owners_ns"], OTHER_THREADS: r["other_threads_ns"]})
    ranked = pyprofile.top({s: [r["self_ns"] for r in runs[s]] for s in SIDES}, rows=args.top)
    functions = _rows(runs, lambda r: {f: r["self_ns"].get(f, 0.0) for f in ranked})
    calls = {s: harness.median(r["python_calls_per_step"] for r in runs[s]) for s in SIDES}
    beside = {s: harness.median(r["other_threads_calls_per_step"] for r in runs[s]) for s in SIDES}
    print(harness.table([["piece (inclusive us per step, median)", *SIDES], *_shown(pieces)]))
    print()
    print(harness.table([["owner (self us per step, median)", *SIDES], *_shown(owners)]))
    print()
    print(harness.table([["function (self us per step, median)", *SIDES], *_shown(functions)]))
    print(f"Python calls per step: trainbox {calls['trainbox']:.0f}, raw {calls['raw']:.0f}"
          " (the tracer's cost grows with them); on other threads: trainbox"
          f" {beside['trainbox']:.1f}, raw {beside['raw']:.1f}")  # fmt: skip
    return bench.finish(
        {"settings": settings, "pieces_us": pieces, "owners_us": owners,
         "functions_us": functions, "python_calls_per_step": calls,
         "other_threads_calls_per_step": beside},
        positive=[r["step_ns"] for rs in runs.values() for r in rs],
    )  # fmt: skip


def _profiled(side: str, nproc: int, batch: int, steps: int, skip: int, active: int) -> Any:
    """One run of `side` with rank 0 profiled: pyprofile's record."""
    with harness.workdir(f"pieces-{side}") as work:
        out = work / "profile.json"
        wrapper = [str(harness.HERE / "pyprofile.py"), str(out), str(skip), str(active)]
        if side == "trainbox":
            program = benchtask.trainbox_run(
                work / "run", steps=steps,
                extra=[f"train.batch_size={batch}", "train.log_every=50", "train.amp=off",
                       "optim.weight_decay=0", "pinning.mode=off", "pinning.num_threads=1"],
            )  # fmt: skip
        else:
            program = benchtask.raw_loop(
                steps=steps,
                extra=[f"--batch-size={batch}", "--log-every=50", f"--out={work / 'marks.json'}"],
            )
        env = harness.clean_env(OMP_NUM_THREADS="1")
        harness.run(harness.torchrun(nproc, *wrapper, *program), env)
        return json.loads(out.read_text())


def _rows(runs: dict[str, list[Any]], pick: Any) -> dict[str, dict[str, float]]:
    """label -> side -> median µs per step of what `pick` takes from each run's record."""
    labels = list(dict.fromkeys(label for s in SIDES for r in runs[s] for label in pick(r)))
    return {
        label: {s: harness.median(pick(r).get(label, 0.0) / 1e3 for r in runs[s]) for s in SIDES}
        for label in labels
    }


def _shown(rows: dict[str, dict[str, float]]) -> list[list[Any]]:
    return [[label, *(round(v[s], 1) for s in SIDES)] for label, v in rows.items()]


if __name__ == "__main__":
    sys.exit(main())
