"""The trainer's own per-step work, in one process, side by side with an empty loop.

    .venv/bin/python benchmarks/step_overhead.py            # 9 interleaved repetitions
    .venv/bin/python benchmarks/step_overhead.py --quick    # 2 short ones (CI)

No torchrun and no second rank: a world of one (gloo, an in-memory store) trains a model so
small (Linear(4, 2), batches of 8) that forward, backward and the optimizer step cost almost
nothing, and both sides pay the same for them. "empty" is the raw loop of raw_ddp.py: a
DataLoader with a DistributedSampler, `.to(device)`, DDP forward, cross entropy, backward,
AdamW, zero_grad. "trainbox" is trainbox's TrainingLoop with everything it does per step: its
batches, sample count, watchdog marks, fault injection points, the loss sums, the schedule, the
stop vote (its thread votes as in a real run), a metrics line every `--log-every` steps. The
difference of the steady-state step times is the trainer's per-step overhead. Target: <= 50 us
per step.

`--breakdown` also times each piece of that per-step work alone, on the loop's own objects
(the table in benchmarks/README.md):
    .venv/bin/python benchmarks/step_overhead.py --breakdown

Every run also counts the Python bytecodes each side executes per step (sys.settrace's opcode
events, over N and 2N steps, so start-up cancels out): unlike a time, that count does not move
with the load on the machine, so it shows where trainbox's extra Python work is even when the
timings are noise. It prints the functions whose counts differ most.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import timeit
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import harness
import raw_ddp
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainbox import logs, watchdog
from trainbox.config import Config, load
from trainbox.launch.context import LaunchContext
from trainbox.train.data import batches
from trainbox.train.data.contract import Datasets
from trainbox.train.loop import LoopInputs, TrainingLoop
from trainbox.train.step_hooks import DeviceBatches, StepHooks
from trainbox.train.steps.functions import Step, fit_problem, train_loss
from trainbox.train.watch.control import RunControl
from trainbox.train.watch.metrics import StepMetrics
from trainbox.train.watch.progress import Progress

TARGET_US = 50.0
BATCH = 8
FEATURES, CLASSES, SAMPLES = 4, 2, 4096


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """One run of either side."""

    # Optimizer steps per run.
    steps: int
    # Steps between marks (trainbox writes a metrics line there).
    log_every: int
    # Marks before this step are start-up, not steady state.
    warmup: int


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--steps", type=int, default=0, help="steps per run (0: default)")
    parse.add_argument("--log-every", type=int, default=50)
    parse.add_argument("--breakdown", action="store_true", help="also time each piece alone")
    args = parse.parse_args()
    bench = harness.start("step_overhead", args, reps=9, quick_reps=2)
    steps = args.steps or (400 if args.quick else 3000)
    settings = Settings(steps=steps, log_every=args.log_every, warmup=min(200, steps // 4))
    harness.torch_setup(1)
    # trainbox's log lines are rendered as in a run (their cost counts), then dropped.
    with open(os.devnull, "w") as devnull, world_of_one():
        logs.configure({"TRAINBOX_LOG_FORMAT": "json"}, stream=devnull)
        sides = bench.rounds(
            [("trainbox", lambda: trainbox(settings)), ("empty", lambda: empty(settings))],
            quiet=False,
        )
        parts = breakdown(settings) if args.breakdown else {}
        traced = {name: opcodes(fn, steps=100 if args.quick else 300)
                  for name, fn in (("trainbox", trainbox), ("empty", empty))}  # fmt: skip
    tb, base = sides["trainbox"], sides["empty"]
    overhead_us = (harness.median(tb) - harness.median(base)) * 1e6
    paired_us = [(t - b) * 1e6 for t, b in zip(tb, base, strict=True)]
    micros = {name: [t * 1e6 for t in times] for name, times in sides.items()}
    print(harness.medians(["side", "median step (us)", "runs (step us)"], micros, ".1f"))
    result = bench.judge("trainer per-step overhead", overhead_us, at_most=TARGET_US,
                         shown="+.1f", unit=" us")  # fmt: skip
    print(f"paired differences (noise): {harness.spread(paired_us, '+.1f')}")
    per_step = {name: sum(counts.values()) for name, counts in traced.items()}
    print(
        f"Python opcodes per step: trainbox {per_step['trainbox']:.0f}, empty"
        f" {per_step['empty']:.0f}, difference {per_step['trainbox'] - per_step['empty']:+.0f}"
    )
    print(harness.table([["function (file:name)", "trainbox", "empty"], *opcode_rows(traced)]))
    if parts:
        print(harness.table([["piece of trainbox's step (alone)", "us per step"], *parts.items()]))
        print(f"sum of the pieces: {sum(parts.values()):.1f} us per step")
    return bench.finish(
        {
            "settings": {**dataclasses.asdict(settings), "reps": bench.reps, "batch": BATCH,
                         "threads": 1},
            "step_time_s": sides,
            "overhead_us_per_step": overhead_us,
            "paired_overhead_us": paired_us,
            "breakdown_us": parts,
            "opcodes_per_step": per_step,
            "target": f"overhead <= {TARGET_US:.0f} us per step",
            "result": result,
        },
        positive=[t for times in sides.values() for t in times],
    )  # fmt: skip


@contextmanager
def world_of_one() -> Iterator[None]:
    """A gloo group of this process alone, on an in-memory store (no port)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def samples() -> TensorDataset:
    """Random features with random labels: what is learnt does not matter here."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    return TensorDataset(inputs, torch.randint(0, CLASSES, (SAMPLES,), generator=generator))


def trainbox(settings: Settings) -> float:
    """Steady-state seconds per step of trainbox's loop (marks: its metrics lines' times)."""
    with harness.workdir("step-overhead") as work:
        config = load(None, overrides(work, settings))
        watch = watchdog.Watchdog(
            rank=0,
            world_size=1,
            host="bench",
            timeout_s=config.dist.timeout_s,
            store=dist.HashStore(),
            on_hang=print,  # no hang to report: a world of one, and no collective waits
        )
        torch.manual_seed(0)
        with watch:
            loop = TrainingLoop(loop_inputs(config, control=RunControl(mark=watch.mark)))
            try:
                loop.fit()
            finally:
                loop.close()
        return harness.steady_step_time(harness.train_marks(work), warmup=settings.warmup)


def empty(settings: Settings) -> float:
    """Steady-state seconds per step of the raw loop, with marks at the same steps."""
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, CLASSES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    loader = raw_ddp.batches(samples(), rank=0, world=1, size=BATCH)
    marks = raw_ddp.train(model, optimizer, loader, steps=settings.steps,
                          log_every=settings.log_every, device=torch.device("cpu"))  # fmt: skip
    return harness.steady_step_time(marks, warmup=settings.warmup)


def opcodes(side: Callable[[Settings], float], *, steps: int) -> Counter[str]:
    """Python opcodes per step of `side`, by function: runs of `steps` and 2 x `steps` steps,
    traced, subtracted (start-up and the end of a run cancel out)."""
    runs = []
    for n in (steps, 2 * steps):
        counts: Counter[str] = Counter()

        def trace(frame: Any, event: str, _arg: Any, counts: Counter[str] = counts) -> Any:
            if event == "call":
                frame.f_trace_opcodes = True
            elif event == "opcode":
                code = frame.f_code
                counts[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
            return trace

        sys.settrace(trace)
        try:
            side(Settings(steps=n, log_every=50, warmup=min(200, n // 4)))
        finally:
            sys.settrace(None)
        runs.append(counts)
    once, twice = runs
    return Counter({name: (twice[name] - once[name]) / steps for name in twice | once})


def opcode_rows(traced: dict[str, Counter[str]], *, top: int = 15) -> list[list[Any]]:
    """The functions whose opcode counts per step differ most between the sides."""
    ours, theirs = traced["trainbox"], traced["empty"]
    names = sorted(ours | theirs, key=lambda name: -abs(ours[name] - theirs[name]))
    return [[name, round(ours[name], 1), round(theirs[name], 1)] for name in names[:top]]


def breakdown(settings: Settings) -> dict[str, float]:
    """Microseconds per step of each piece of trainbox's per-step work, timed alone (best of 5
    rounds), on a loop built as trainbox() builds it; what the raw loop also does subtracted."""
    with harness.workdir("step-breakdown") as work:
        config = load(None, overrides(work, settings))
        torch.manual_seed(0)
        loop = TrainingLoop(loop_inputs(config))
        try:
            loop.control.start(0, timeout_s=config.dist.timeout_s, every_s=config.dist.vote_every_s)
            parts = pieces(loop, settings)
            loop.control.finish(timeout_s=config.dist.timeout_s)
            return parts
        finally:
            loop.close()


def loop_inputs(config: Config, control: RunControl | None = None) -> LoopInputs:
    """trainbox's loop of either measurement: the tiny model on samples(), one CPU process."""
    return LoopInputs(
        config=config,
        context=context(),
        device=torch.device("cpu"),
        model=torch.nn.Linear(FEATURES, CLASSES),
        data=Datasets(train=samples(), val=None, max_workers=0),
        control=RunControl() if control is None else control,
    )


def pieces(loop: TrainingLoop, settings: Settings) -> dict[str, float]:
    """Each piece's cost in us per step (see breakdown)."""
    device, state, control = loop.device, loop.state, loop.control
    stats = StepMetrics(
        loop.metrics,
        device=device,
        world_size=1,
        user_code=loop.user_code,
        last_good=loop.checkpoints.last_good,
        start_step=0,
        last_loss=None,
        parts=loop.parts,
    )
    batch = next(loop.batches.iterate(loop.batches.position(0)))
    inputs, targets = batch
    outputs = loop.module(inputs).float()
    loss = torch.nn.functional.cross_entropy(outputs, targets)
    given = Step(fn=lambda _model, _batch: loss, name="given")
    progress = Progress(settings.steps, enabled=False)
    sampler = DistributedSampler(loop.batches.dataset, num_replicas=1, rank=0, seed=0)
    raw_batches = endless(DataLoader(loop.batches.dataset, batch_size=BATCH, sampler=sampler))
    ours = loop.batches.iterate(loop.batches.position(0))

    hooks = StepHooks(
        control=control,
        clock=loop.clock,
        stats=stats,
        checkpoints=loop.checkpoints,
        batches=DeviceBatches(iter(()), device),
        micro_batches=1,
    )

    def both_to() -> tuple[torch.Tensor, torch.Tensor]:
        return inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)

    def log() -> None:
        stats.add(loss, BATCH)  # a line needs a step in its window
        stats.log(state.step, epoch=0, lr=0.1, progress=progress)

    us: dict[str, float] = {
        "data: TrainBatches - DataLoader(DistributedSampler)": cost(lambda: next(ours))
        - cost(lambda: next(raw_batches)),
        "count and move (on_device) - two .to()": cost(lambda: batches.on_device(batch, device))
        - cost(both_to),
        "perf_counter x2 (data wait)": cost(lambda: (time.perf_counter(), time.perf_counter())),
        "hooks.step_starts + the forward mark": cost(
            lambda: (hooks.step_starts(1), hooks.mark("f", 1))
        ),
        "train_loss checks": cost(lambda: train_loss(given, None, batch)),
        "loss_fn fit check + .float()": cost(
            lambda: (fit_problem("cross_entropy", outputs, targets), outputs.float())
        ),
        "loss.detach + hooks.backward_done (clock synced)": cost(
            lambda: hooks.backward_done({}, last=loss.detach().dim() == 0)
        ),
        "hooks.step_ends (clock end, loss sums)": cost(lambda: hooks.step_ends(1, loss, BATCH)),
        "scheduler.step": cost(state.scheduler.step),
        "control.stop_after (the vote)": cost(lambda: control.stop_after(1)),
        f"metrics line / {settings.log_every}": cost(log, number=50) / settings.log_every,
    }
    return {name: round(value, 2) for name, value in us.items()}


def endless(loader: DataLoader[Any]) -> Iterator[Any]:
    """The raw loop's batches, epoch after epoch."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        yield from loader
        epoch += 1


def cost(fn: Callable[[], object], *, number: int = 2000) -> float:
    """Microseconds per call of `fn`: the best of 5 rounds of `number` calls."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def overrides(work: Path, settings: Settings) -> list[str]:
    """trainbox's side: the same batches, AdamW, no evaluation, no checkpoints but the last."""
    return [
        f"run_dir={work}", f"train.max_steps={settings.steps}", f"train.batch_size={BATCH}",
        f"train.log_every={settings.log_every}", "train.eval_every=0", "train.ckpt_every=0",
        "train.resume=never", "train.amp=off", "optim.weight_decay=0", "optim.name=adamw",
    ]  # fmt: skip


def context() -> LaunchContext:
    """One process on its own, as `trainbox run` without a launcher sees it."""
    return LaunchContext(
        launcher="single", flavor="single", rank=0, local_rank=0, world_size=1,
        local_world_size=1, node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=0,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
