"""Goodput with ranks killed: in-process recovery (`dist.recovery=in_process`) against torchrun's
restarts from the newest checkpoint (`dist.recovery=restart`), and what the first costs when
nothing fails.

    .venv/bin/python benchmarks/goodput.py                               # 4 ranks, 5-minute runs
    .venv/bin/python benchmarks/goodput.py --minutes 1 --kill-every 15   # shorter runs
    .venv/bin/python benchmarks/goodput.py --steady-only                 # part 1 alone
    .venv/bin/python benchmarks/goodput.py --quick                       # CI: 2 ranks, one kill

Every run is `trainbox run dist.procs_per_node=N` (node mode: trainbox supervises torchrun's
agent) of benchtask's MLP, one thread per rank, `train.log_every=10`, `train.ckpt_every=500`;
the sides differ only in `dist.recovery`.

1. Steady cost: with nothing failing, steps/s of in_process (a keeper, a trainer and a warm spare
   per rank) against restart, alternating, `--reps` runs of each: the median step over windows
   of metrics.jsonl after a warm-up. Target: in_process at least 0.99 of restart.
2. Goodput: one run of each side, alternating, lasting `--minutes` from its first train line.
   Every `--kill-every` seconds one rank, drawn from a seeded stream (the same ranks on both
   sides), loses its training process to SIGKILL: under restart the torchrun worker (RANK set,
   no TRAINBOX_ROLE), after which torchrun restarts every worker and they resume from the
   newest checkpoint; under in_process the rank's trainer (the keeper's older child: the first
   trainer has TRAINBOX_ROLE=trainer, a spare that took over still shows TRAINBOX_ROLE=spare),
   whose spare takes over. Then SIGTERM (held until the run trains again if a recovery is
   still under way): a checkpoint, exit 143 and metrics.jsonl's `stop` record.
   Goodput = steps kept per second from the first train line to the SIGTERM, divided by
   restart's no-kill steps per second from part 1 measured the same way (every step from the
   warm-up to the last, over the time they took), so that a run with no kill scores about 1.
   Also reported: each in-process recovery's seconds and steps trained again (its `recovery`
   records), and for restart the steps trained again per kill, as the last train line before
   the kill less the newest checkpoint then (up to log_every - 1 steps more were lost).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchtask
import harness

SIDES = ("restart", "in_process")
# In-process recovery's cost with nothing failing: at least this share of restart's steps/s.
TARGET_STEADY = 0.99
LOG_EVERY = 10
CKPT_EVERY = 500
# More steps than any run takes: runs end by SIGTERM.
ENDLESS = 10**8
# Seconds a run may take from SIGTERM to its exit (a checkpoint, the workers' exits).
STOP_S = 120.0
# Seconds a run may take to train again after its last kill before it is stopped regardless.
RECOVER_S = 300.0


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--minutes", type=float, default=5.0, help="length of each goodput run")
    parse.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills")
    parse.add_argument("--nproc", type=int, default=0, help="ranks (default 4; --quick 2)")
    parse.add_argument("--steps", type=int, default=0, help="steps of a steady-cost run")
    parse.add_argument("--steady-only", action="store_true", help="part 1 alone: no kills")
    args = parse.parse_args()
    bench = harness.start("goodput", args, reps=5, quick_reps=1)
    nproc = args.nproc or (2 if args.quick else 4)
    # Quick: the shortest runs that still go through every path, a kill on each side included.
    steps = args.steps or (60 if args.quick else 2400)
    # The first third: start-up, and under in_process the spares starting beside the trainers.
    warmup = steps // 3
    seconds = 3.0 if args.quick else args.minutes * 60
    kill_every = 1.5 if args.quick else args.kill_every
    kills_planned = max(0, int((seconds - 1e-9) // kill_every))
    # Enough restarts and recoveries that no kill ends a run; part 1 runs with the same, as
    # with dist.max_recoveries=0 a keeper would keep no spare.
    limit = kills_planned + 5

    steady = bench.rounds(
        [
            (side, _steady(side, nproc=nproc, steps=steps, warmup=warmup, limit=limit))
            for side in SIDES
        ]
    )
    rate = {side: [run["steps_per_s"] for run in runs] for side, runs in steady.items()}
    span = {side: [run["span_steps_per_s"] for run in runs] for side, runs in steady.items()}
    print(f"\nno rank killed: {nproc} ranks, {steps} steps a run, steps/s after step {warmup}")
    print(harness.table([
        ["recovery", "steps/s (median window)", "runs", "steps/s (whole span)", "runs"],
        *([side, harness.median(rate[side]), harness.spread(rate[side]),
           harness.median(span[side]), harness.spread(span[side])] for side in SIDES),
    ]))  # fmt: skip
    steady_ratio = harness.ratio(rate["in_process"], rate["restart"])
    low, high = harness.ratio_interval(rate["in_process"], rate["restart"])
    print(f"in_process / restart, nothing failing: {steady_ratio:.4f}"
          f" (90 % interval {low:.4f}-{high:.4f})")  # fmt: skip
    bench.judge("steady steps/s, in_process / restart", steady_ratio, at_least=TARGET_STEADY)
    results: dict[str, Any] = {
        "settings": {
            "ranks": nproc, "steady_steps": steps, "warmup": warmup, "reps": bench.reps,
            "seconds": seconds, "kill_every_s": kill_every, "log_every": LOG_EVERY,
            "ckpt_every": CKPT_EVERY, "threads": 1, "model_args": benchtask.MODEL_ARGS,
        },
        "steady": steady,
        "steady_ratio": steady_ratio,
        "steady_ratio_interval": [low, high],
    }  # fmt: skip
    if not args.steady_only:
        no_kill = harness.median(span["restart"])
        results |= goodput_runs(bench, nproc=nproc, seconds=seconds, kill_every=kill_every,
                           limit=limit, no_kill=no_kill)  # fmt: skip
    return bench.finish(results, positive=[*rate["restart"], *rate["in_process"], *span["restart"]])


def goodput_runs(
    bench: harness.Bench,
    *,
    nproc: int,
    seconds: float,
    kill_every: float,
    limit: int,
    no_kill: float,
) -> dict[str, Any]:
    """Part 2: one run of each side with its ranks killed; goodput against `no_kill` steps/s."""
    print(f"\ngoodput: {seconds:g} s from the first train line, a rank's training process"
          f" killed every {kill_every:g} s", file=sys.stderr)  # fmt: skip
    killed = harness.interleave(1, [
        (side, _killed(side, nproc=nproc, seconds=seconds, kill_every=kill_every, limit=limit))
        for side in SIDES
    ], quiet=not bench.quick)  # fmt: skip
    runs = {side: found[0] for side, found in killed.items()}
    for run in runs.values():
        run["goodput"] = run["kept_steps_per_s"] / no_kill
    print(f"\ngoodput, against restart's {no_kill:.1f} steps/s with no kill (whole span)")
    print(harness.table([
        ["recovery", "kills", "steps kept", "seconds", "steps/s kept", "goodput",
         "steps retrained", "end"],
        *([side, run["kills"], run["kept_steps"], run["seconds"], run["kept_steps_per_s"],
           run["goodput"], run["steps_retrained"],
           f"exit {run['exit']}, {'stop record' if run['stop_record'] else 'no stop record'}"]
          for side, run in runs.items()),
    ]))  # fmt: skip
    restart, in_process = runs["restart"], runs["in_process"]
    recoveries = in_process["recoveries"]
    recovery_s = [record["seconds"] for record in recoveries]
    if recovery_s:
        print(f"in_process: {len(recoveries)} recovery records for {in_process['kills']} kills;"
              f" seconds median {harness.median(recovery_s):.3f}, max {max(recovery_s):.3f};"
              f" steps retrained {[r['steps_retrained'] for r in recoveries]}")  # fmt: skip
    per_kill = restart["retrained_per_kill"]
    print(f"restart: steps retrained per kill {per_kill} (last train line before the kill less"
          f" the newest checkpoint then)")  # fmt: skip
    # A restart run that kept nothing past its first train line has no ratio to show.
    goodput_ratio = in_process["goodput"] / restart["goodput"] if restart["goodput"] else None
    shown = "n/a (restart kept nothing)" if goodput_ratio is None else f"{goodput_ratio:.3f}"
    print(f"goodput in_process / restart: {shown}")
    return {
        "no_kill_steps_per_s": no_kill,
        "killed": runs,
        "recovery_seconds": {
            "median": harness.median(recovery_s) if recovery_s else None,
            "max": max(recovery_s) if recovery_s else None,
        },
        "goodput_ratio": goodput_ratio,
    }


def _argv(run_dir: Path, side: str, *, nproc: int, steps: int, limit: int) -> list[str]:
    """`trainbox run` in node mode with `side`'s recovery, the same settings on both sides."""
    extra = [f"train.log_every={LOG_EVERY}", f"train.ckpt_every={CKPT_EVERY}",
             "train.resume=auto", "train.amp=off", "preflight.gpus=off",
             "pinning.num_threads=1", f"dist.procs_per_node={nproc}",
             f"dist.recovery={side}", f"dist.max_restarts={limit}",
             f"dist.max_recoveries={limit}"]  # fmt: skip
    return [sys.executable, *benchtask.trainbox_run(run_dir, steps=steps, extra=extra)]


def _env() -> dict[str, str]:
    # CPU even where GPUs are visible: this measures CPU processes.
    return harness.clean_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


def _steady(
    side: str, *, nproc: int, steps: int, warmup: int, limit: int
) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        with harness.workdir(f"goodput-{side}") as work:
            harness.run(_argv(work, side, nproc=nproc, steps=steps, limit=limit), _env())
            marks = harness.train_marks(work)
            kept = [(step, at) for step, at in marks if step >= warmup]
            (first, began), (last, ended) = kept[0], kept[-1]
            return {
                "steps_per_s": 1 / harness.steady_step_time(marks, warmup=warmup),
                "span_steps_per_s": (last - first) / (ended - began),
            }

    return run


def _killed(
    side: str, *, nproc: int, seconds: float, kill_every: float, limit: int
) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        with harness.workdir(f"goodput-killed-{side}") as work:
            return _kill_run(work, side, nproc=nproc, seconds=seconds, kill_every=kill_every,
                             limit=limit)  # fmt: skip

    return run


def _kill_run(
    work: Path, side: str, *, nproc: int, seconds: float, kill_every: float, limit: int
) -> dict[str, Any]:
    """One goodput run: kills on schedule, then SIGTERM; what was kept, and what it cost."""
    run_dir, log_path = work / "run", work / "run.log"
    # The same ranks, in the same order, on both sides.
    draw = random.Random(0)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            _argv(run_dir, side, nproc=nproc, steps=ENDLESS, limit=limit), env=_env(), stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            first = _wait_first_train(run_dir, proc)
            began = time.monotonic()
            kills: list[dict[str, Any]] = []
            while (due := began + (len(kills) + 1) * kill_every) < began + seconds:
                _sleep_until(due, proc)
                since = kills[-1]["at"] if kills else 0.0
                kills.append(_kill_one(proc.pid, side, draw.randrange(nproc), run_dir, since))
            _sleep_until(began + seconds, proc)
            if kills:
                _wait_trained_since(kills[-1]["at"], run_dir, proc)
        except RuntimeError as err:
            # The scratch directory goes with this error: keep the run's log where it is read.
            kept_log = harness.scratch(f"goodput-{side}-log") / "run.log"
            kept_log.write_bytes(log_path.read_bytes())
            raise RuntimeError(f"{side}: {err}; its log: {kept_log}") from err
        finally:
            stopped_at = time.time()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
    exit_s = time.time() - stopped_at
    records = _records(run_dir)
    stops = [record for record in records if record.get("kind") == "stop"]
    # Without a stop record (a run that did not stop as asked) it keeps its newest checkpoint.
    kept = stops[-1]["step"] if stops else _newest_checkpoint(run_dir)
    # Up to the SIGTERM: the stop that follows is the benchmark's doing, not the job's.
    seconds_kept = stopped_at - first[1]
    recoveries = [
        {"seconds": r["seconds"], "steps_retrained": r["steps_retrained"], "rank": r["rank"]}
        for r in records
        if r.get("kind") == "recovery"
    ]
    if side == "in_process":
        per_kill = [r["steps_retrained"] for r in recoveries]
    else:
        per_kill = [kill["retrained"] for kill in kills]
    return {
        "exit": code,
        "stop_record": bool(stops),
        "exit_s": exit_s,
        "kills": len(kills),
        "killed": kills,
        "first_train": first,
        "kept_steps": kept,
        "seconds": seconds_kept,
        "kept_steps_per_s": max(0, kept - first[0]) / seconds_kept,
        "steps_retrained": sum(per_kill),
        "retrained_per_kill": per_kill,
        "recoveries": recoveries,
    }


def _wait_first_train(run_dir: Path, proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """(step, time) of the run's first train line, once it is written."""
    while True:
        trained = [r for r in _records(run_dir) if r.get("kind") == "train"]
        if trained:
            return trained[0]["step"], trained[0]["time"]
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before its first step")
        time.sleep(0.1)


def _wait_trained_since(at: float, run_dir: Path, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the run writes a train line after epoch time `at` (at most RECOVER_S).

    A SIGTERM while torchrun restarts the workers is held until they have started (up to 30 s)
    and ends the run without a stop record; so the run ends once it trains again, and the
    time to that point counts against it.
    """
    deadline = time.monotonic() + RECOVER_S
    while time.monotonic() < deadline:
        if any(r.get("kind") == "train" and r["time"] > at for r in _records(run_dir)):
            return
        _sleep_until(time.monotonic() + 0.1, proc)


def _sleep_until(due: float, proc: subprocess.Popen[bytes]) -> None:
    while (left := due - time.monotonic()) > 0:
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended early (exit {proc.returncode})")
        time.sleep(min(left, 0.2))


def _kill_one(root: int, side: str, rank: int, run_dir: Path, since: float) -> dict[str, Any]:
    """SIGKILL rank `rank`'s training process under `root`: torchrun's worker under restart,
    the keeper's trainer under in_process. Waits while a restart has none to kill.

    `since`: when the kill before this one came (epoch seconds, 0 for the first)."""
    waited = time.monotonic()
    while (victim := _victim(_descendants(root), side, rank)) is None:
        time.sleep(0.05)
    # Read before the kill: the resume that follows a restart drops the lines past its step.
    trained = [r for r in _records(run_dir) if r.get("kind") == "train"]
    last = trained[-1]["step"] if trained else 0
    saved = _newest_checkpoint(run_dir)
    os.kill(victim, signal.SIGKILL)
    kill = {"rank": rank, "pid": victim, "at": time.time(), "last_train_step": last,
            "checkpoint_step": saved, "waited_s": round(time.monotonic() - waited, 3)}  # fmt: skip
    if side == "restart":
        # No train line since the last kill: the job was still restarting, and the steps past
        # the checkpoint were counted with that kill already.
        fresh = bool(trained) and trained[-1]["time"] > since
        kill["retrained"] = max(0, last - saved) if fresh else 0
    return kill


@dataclass(frozen=True, slots=True)
class Process:
    """A process below the benchmark's `trainbox run`, as /proc shows it."""

    pid: int
    # Clock ticks after boot when it started: which of two processes is older.
    started: int
    # The environment it started with (a later os.environ change does not show here).
    env: dict[str, str]


def _victim(processes: list[Process], side: str, rank: int) -> int | None:
    """The pid that trains rank `rank` now, or None (a restart under way)."""
    held = [p for p in processes if p.env.get("RANK") == str(rank)]
    if side == "restart":
        workers = [p.pid for p in held if "TRAINBOX_ROLE" not in p.env]
        return workers[0] if workers else None
    # The keeper's trainer: the first one has TRAINBOX_ROLE=trainer; a spare that took over
    # keeps the TRAINBOX_ROLE=spare it started with. The keeper starts each new spare after
    # the trainer it stands behind, so the older of its two children is the trainer.
    kept = sorted((p for p in held if "TRAINBOX_ROLE" in p.env), key=lambda p: p.started)
    return kept[0].pid if kept else None


def _descendants(root: int) -> list[Process]:
    """Every process below `root`."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # The fields after the command's closing parenthesis, from the state on.
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        for pid, fields in stats.items():
            if int(fields[1]) != parent:
                continue
            frontier.append(pid)
            try:
                raw = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
            env = {key.decode(): value.decode(errors="replace") for key, _, value in pairs}
            # starttime is field 22 of /proc/PID/stat; these fields begin at field 3.
            found.append(Process(pid=pid, started=int(fields[19]), env=env))
    return found


def _newest_checkpoint(run_dir: Path) -> int:
    """The step of the newest whole checkpoint (its .sha256 marker written), 0 if none."""
    steps = [
        int(path.name.removeprefix("step-").split(".")[0])
        for path in (run_dir / "checkpoints").glob("step-*.pt.sha256")
    ]
    return max(steps, default=0)


def _records(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records so far (a half-written last line skipped)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


if __name__ == "__main__":
    raise SystemExit(main())
