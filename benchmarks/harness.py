"""The benchmarks' harness: set-up, side-by-side rounds and recording, for every script here.

A benchmark compares two (or three) sides in one run, alternating them (A B A B ...) so that
load from other processes and thermal drift hit every side alike; it reports medians and the
ratio of medians, never an absolute time on its own. `--quick` runs few short repetitions so CI
checks that the benchmark still works; only full runs judge the targets (PASS/MISS).

A benchmark's main reads its options (`parser`), starts its run (`start`), runs its sides
(`Bench.rounds`), prints its tables and targets (`table`, `Bench.judge`) and ends with the JSON
line and the exit code (`Bench.finish`); benchmarks/README.md says which script to copy.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import math
import os
import platform
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from trainbox.affinity import CpuPlan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
T = TypeVar("T")
# What benchmarks/raw_ddp.py prints to stderr when its first optimizer step is done.
FIRST_STEP = "raw_ddp: first step done"

# Launcher variables of whatever runs the benchmark must not leak into the jobs it starts.
_LEAKY = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "TORCHELASTIC_", "PET_", "TRAINBOX_")
_LEAKY_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
                "OMP_NUM_THREADS", "MKL_NUM_THREADS"}  # fmt: skip


# -- set-up -----------------------------------------------------------------------------------


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes: --quick, --reps, --save."""
    text = (doc or "").strip()
    parse = argparse.ArgumentParser(
        description=text.splitlines()[0] if text else None,
        epilog=text,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parse.add_argument("--quick", action="store_true", help="few short repetitions (CI)")
    parse.add_argument("--reps", type=int, default=0, help="repetitions per side (0: default)")
    parse.add_argument(
        "--save", action="store_true", help="also write benchmarks/results/NAME.json"
    )
    return parse


def worker_options(parse: argparse.ArgumentParser, sides: Sequence[str]) -> None:
    """The hidden options by which a data benchmark starts itself again as one side's worker."""
    parse.add_argument("--worker", choices=sides, help=argparse.SUPPRESS)
    parse.add_argument("--root", help=argparse.SUPPRESS)
    parse.add_argument("--batches", type=int, default=0, help=argparse.SUPPRESS)
    parse.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    parse.add_argument("--out", help=argparse.SUPPRESS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bench:
    """One run of a benchmark, as its command line asked for it."""

    # The benchmark's name: its file's stem, the JSON line's `benchmark`, the results file's.
    name: str
    # Few short repetitions (CI): no target judged, no quiet moment waited for.
    quick: bool
    # Whether finish() also writes benchmarks/results/NAME.json.
    save: bool
    # Repetitions per side.
    reps: int

    def rounds(
        self, sides: Sequence[tuple[str, Callable[[], T]]], *, quiet: bool | None = None
    ) -> dict[str, list[T]]:
        """interleave() with this run's repetitions; a full run waits for quiet CPUs first."""
        return interleave(self.reps, sides, quiet=not self.quick if quiet is None else quiet)

    def verdict(self, ok: bool) -> str:
        """PASS or MISS against a target; quick runs are too short and noisy to judge."""
        return verdict(ok, quick=self.quick)

    def judge(
        self,
        label: str,
        value: float,
        *,
        at_most: float | None = None,
        at_least: float | None = None,
        shown: str = ".3f",
        unit: str = "",
    ) -> str:
        """Print `LABEL: VALUE (target OP TARGET): VERDICT` for one bound; the verdict."""
        if at_most is not None:
            op, target, ok = "<=", at_most, value <= at_most
        elif at_least is not None:
            op, target, ok = ">=", at_least, value >= at_least
        else:
            raise ValueError("judge needs at_most or at_least")
        result = self.verdict(ok)
        print(f"{label}: {value:{shown}}{unit} (target {op} {target:g}{unit}): {result}")
        return result

    def finish(
        self,
        results: dict[str, Any],
        *,
        positive: Iterable[float],
        holds: Mapping[str, bool] | None = None,
    ) -> int:
        """finish() for this run: the JSON line, saved if asked; the exit code."""
        return finish(self.name, results, positive=positive, holds=holds, quick=self.quick,
                      save=self.save)  # fmt: skip


def start(name: str, args: argparse.Namespace, *, reps: int, quick_reps: int = 1) -> Bench:
    """The run `args` asks for: `--reps` repetitions, else `quick_reps` if --quick, else `reps`."""
    return Bench(
        name=name,
        quick=args.quick,
        save=args.save,
        reps=args.reps or (quick_reps if args.quick else reps),
    )


def torch_setup(threads: int, *, seed: int = 0) -> None:
    """This process's torch: `threads` intra-op threads, seeded."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(seed)


def cpu_plan() -> CpuPlan:
    """trainbox's CPU plan for this process, applied as `trainbox run` applies it: before torch
    starts its thread pools (call it first; torch's threads follow in set_torch_threads)."""
    from trainbox import config
    from trainbox.process import bootstrap

    with workdir("plan") as run_dir:
        settings = config.load(None, ["preflight.gpus=off", f"run_dir={run_dir}"])
        prepared = bootstrap.startup_facts(os.environ, settings)
        bootstrap.apply_cpu_plan(prepared, os.environ)
    return prepared.plan


def default_nproc() -> int:
    """Processes for a 2-process comparison: 2 on CPU; on GPUs, one per GPU, at most 2."""
    import torch

    return min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 2


# -- processes and files ----------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher or thread variables, plus `extra`.

    benchmarks/ goes first on PYTHONPATH, so `benchtask:model` resolves as a factory.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_LEAKY) and key not in _LEAKY_NAMES
    }
    paths = [str(HERE), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["TRAINBOX_LOG_FORMAT"] = "json"
    return env | extra


def by_hand(rank: int, world: int, port: int | str) -> dict[str, str]:
    """The variables of rank `rank` of an env:// job on this machine, exported by hand."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}  # fmt: skip


def free_port() -> int:
    """A port nobody listens on now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def torchrun(nproc: int, *args: str) -> list[str]:
    """argv for `torchrun --standalone --nproc-per-node NPROC ARGS` with this interpreter."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", *args,
    ]  # fmt: skip


def run(argv: Sequence[str], env: Mapping[str, str], *, timeout: float = 600) -> str:
    """Run to the end; return stdout+stderr, or raise with the tail of it on failure."""
    proc = subprocess.run(
        list(argv),
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}\n{proc.stdout[-3000:]}")
    return proc.stdout


def result_of(argv: Sequence[str], env: Mapping[str, str], *, timeout: float = 600) -> Any:
    """Run `ARGV --out=FILE` to the end, FILE in a scratch directory; the JSON it wrote there."""
    with workdir("result") as work:
        out = work / "result.json"
        run([*argv, f"--out={out}"], env, timeout=timeout)
        return json.loads(out.read_text())


def cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds, all threads: of this process, or of process `pid` (from /proc; 0 if gone)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the ')': state is field 3, utime field 14 and stime field 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scratch(prefix: str) -> Path:
    """A fresh temporary directory (removed by the caller)."""
    return Path(tempfile.mkdtemp(prefix=f"trainbox-bench-{prefix}-"))


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    """A fresh temporary directory, removed with what it holds on leaving."""
    work = scratch(prefix)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def clear(directory: Path) -> None:
    """Remove what `directory` holds and flush dirty pages, so that each write starts alike."""
    for path in directory.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    os.sync()


# -- side-by-side rounds ----------------------------------------------------------------------


def interleave(
    reps: int, sides: Sequence[tuple[str, Callable[[], T]]], *, quiet: bool = False
) -> dict[str, list[T]]:
    """Run the sides in turn, A B A B ..., `reps` times each; results per side in run order.

    With `quiet`, each run first waits (a while, not for ever) for other processes to leave the
    CPUs alone.
    """
    results: dict[str, list[T]] = {name: [] for name, _ in sides}
    for rep in range(reps):
        for name, side in sides:
            other = f", others busy {wait_quiet():.2f} CPUs" if quiet else ""
            print(f"  rep {rep + 1}/{reps}: {name}{other} ...", file=sys.stderr, flush=True)
            result, background = measured(side)
            results[name].append(result)
            BACKGROUND.setdefault(name, []).append(round(background, 3))
            print(f"    others used {background:.2f} CPUs meanwhile", file=sys.stderr, flush=True)
    return results


# CPUs that processes other than the benchmark's kept busy during each run, per side.
BACKGROUND: dict[str, list[float]] = {}


def measured(side: Callable[[], T]) -> tuple[T, float]:
    """side()'s result, and how many CPUs other processes (not ours) kept busy meanwhile."""
    before = _cpu_clocks()
    result = side()
    after = _cpu_clocks()
    wall = max(after[0] - before[0], 1e-9)
    others = (after[1] - before[1]) - (after[2] - before[2])
    return result, max(0.0, others / wall)


def _cpu_clocks() -> tuple[float, float, float]:
    """(wall, CPU-seconds busy on the machine, CPU-seconds of this process and its children)."""
    ours = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF),
                      resource.getrusage(resource.RUSAGE_CHILDREN))
    )  # fmt: skip
    try:
        total, idle = _cpu_ticks()
        busy = (total - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        busy = ours
    return time.monotonic(), busy, ours


def _cpu_ticks() -> tuple[int, int]:
    """(all, idle) clock ticks of the machine's CPUs since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    return sum(fields[:8]), fields[3] + (fields[4] if len(fields) > 4 else 0)


def busy_cpus(seconds: float = 1.0) -> float:
    """How many CPUs were busy (all processes) over the next `seconds`, from /proc/stat."""
    try:
        total0, idle0 = _cpu_ticks()
        time.sleep(seconds)
        total1, idle1 = _cpu_ticks()
    except (OSError, ValueError, IndexError):
        return 0.0
    share = 1 - (idle1 - idle0) / max(total1 - total0, 1)
    return share * (os.cpu_count() or 1)


def wait_quiet(*, below: float = 0.3, limit_s: float = 90.0) -> float:
    """Wait until other processes keep fewer than `below` CPUs busy, at most `limit_s`.

    On a shared machine (other test runs) this starts each repetition from a quiet moment;
    returns the busy CPUs last seen, which the caller reports.
    """
    deadline = time.monotonic() + limit_s
    while True:
        busy = busy_cpus(1.0)
        if busy < below or time.monotonic() > deadline:
            return busy


# -- statistics -------------------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    """The median of the values (at least one)."""
    return float(statistics.median(list(values)))


def ratio(numerator: Iterable[float], denominator: Iterable[float]) -> float:
    """Ratio of the medians."""
    return median(numerator) / median(denominator)


def column(runs: Mapping[str, Sequence[Any]], key: Any) -> dict[str, list[Any]]:
    """Each side's `run[key]` of every run, in run order."""
    return {name: [run[key] for run in found] for name, found in runs.items()}


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], *, level: float = 0.9
) -> tuple[float, float]:
    """A bootstrap interval for ratio(): how far the ratio of medians moves when each side's
    runs are drawn again with replacement (seeded, so the same runs give the same interval)."""
    draw = random.Random(0)
    ratios = sorted(
        ratio(draw.choices(numerator, k=len(numerator)),
              draw.choices(denominator, k=len(denominator)))
        for _ in range(2000)
    )  # fmt: skip
    tail = (1 - level) / 2
    return ratios[int(tail * len(ratios))], ratios[int((1 - tail) * len(ratios)) - 1]


def median_interval(values: Sequence[float], *, level: float = 0.9) -> tuple[float, float]:
    """A bootstrap interval for the median of `values` (drawn again with replacement, seeded)."""
    draw = random.Random(0)
    medians = sorted(median(draw.choices(values, k=len(values))) for _ in range(2000))
    tail = (1 - level) / 2
    return medians[int(tail * len(medians))], medians[int((1 - tail) * len(medians)) - 1]


def train_marks(run_dir: Path) -> list[tuple[int, float]]:
    """(step, time) of every train line of a trainbox run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["time"]) for r in records if r.get("kind") == "train"]


def steady_step_time(marks: Sequence[tuple[int, float]], *, warmup: int) -> float:
    """Seconds per step in steady state: the median over the windows between marks.

    `marks` are (step, time) pairs taken after those steps; windows ending at or before
    `warmup` steps are skipped. The median of windows, rather than the whole span, keeps a burst
    of load from another process from moving the result much.
    """
    kept = sorted((step, at) for step, at in marks if step >= warmup)
    if len(kept) < 2:
        raise ValueError(f"need two marks at or after step {warmup}, got {marks}")
    windows = [
        (at - before_at) / (step - before_step)
        for (before_step, before_at), (step, at) in itertools.pairwise(kept)
    ]
    return median(windows)


# -- recording --------------------------------------------------------------------------------


def sane(value: Any) -> bool:
    """Whether every number in `value` (nested dicts and lists) is finite."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int | float):
        return math.isfinite(value)
    if isinstance(value, Mapping):
        return all(sane(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(sane(v) for v in value)
    return True


def verdict(ok: bool, *, quick: bool) -> str:
    """PASS or MISS against a target; quick runs are too short and noisy to judge."""
    if quick:
        return "n/a (quick)"
    return "PASS" if ok else "MISS"


def machine() -> dict[str, Any]:
    """The machine and software behind the numbers."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    info: dict[str, Any] = {
        "cpu": model,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory, 1),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_1min": round(os.getloadavg()[0], 2),
        **_source(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpus"] = torch.cuda.device_count()
    except ImportError:
        pass
    return info


def _source() -> dict[str, Any]:
    """The commit measured, and whether src/ had uncommitted changes (work in progress)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
            capture_output=True, text=True, check=True,
        ).stdout.split("\n")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": commit, "src_changed": sorted(line[3:] for line in dirty if line.strip())}


def table(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as aligned text columns; the first row is the header."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value)


def finish(
    name: str,
    results: dict[str, Any],
    *,
    positive: Iterable[float],
    quick: bool,
    save: bool,
    holds: Mapping[str, bool] | None = None,
) -> int:
    """Print the JSON line, optionally save it; 0 when the numbers are sane, 1 otherwise.

    Sane: every number in `results` finite, every measurement in `positive` above zero
    (differences such as an overhead may be negative), and every fact in `holds` true (what a
    run must show to have worked, such as a count that matches its prediction; recorded as
    `holds`). Targets are reported (PASS/MISS), not enforced: the exit code says whether the
    benchmark worked.
    """
    record = {"benchmark": name, "quick": quick, "machine": machine(), **results}
    # How much else ran on the machine during each run: the noise behind the numbers.
    record["background_cpus"] = BACKGROUND
    facts = dict(holds or {})
    if facts:
        record["holds"] = facts
    measured = sane(results) and all(math.isfinite(v) and v > 0 for v in positive)
    ok = measured and all(facts.values())
    record["sane"] = ok
    line = json.dumps(record, separators=(",", ":"), default=str)
    if save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    if not measured:
        print(f"{name}: a measurement is not finite or not positive", file=sys.stderr)
    for fact in (fact for fact, held in facts.items() if not held):
        print(f"{name}: does not hold: {fact}", file=sys.stderr)
    print(line, flush=True)
    return 0 if ok else 1


def spread(values: Iterable[float], shown: str = ".0f") -> str:
    """Every run's value, in run order: a table's "runs" cell."""
    return " ".join(f"{value:{shown}}" for value in values)


def medians(header: Sequence[str], runs: Mapping[str, Sequence[float]], shown: str) -> str:
    """A table of each side's median and its runs (`spread` with `shown`), under `header`."""
    return table([header, *([name, median(v), spread(v, shown)] for name, v in runs.items())])
