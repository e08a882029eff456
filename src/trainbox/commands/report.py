"""`trainbox report`: runs' metrics.jsonl drawn as one PNG of loss (smoothed), validation, lr and
speed, and, where the run logged them, per-rank step times with its stragglers marked; several
runs are overlaid, one colour each."""

from __future__ import annotations

import argparse
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from trainbox import atomic
from trainbox.commands.command import Command
from trainbox.errors import UsageError
from trainbox.storage import reading

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
# Bookkeeping fields, not curves worth a line.
_NOT_CURVES = frozenset({"kind", "step", "epoch", "time", "val_samples", "slowest_rank"})


@dataclass(frozen=True)
class Series:
    """One metric's values and the steps they were logged at."""

    steps: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class StragglerRecord:
    """A straggler record: the rank named slow at a step, and why."""

    step: float
    rank: int
    host: str
    cause: str

    def label(self) -> str:
        """`rank R (host)`, as the warning and the hang verdicts name a rank."""
        return f"rank {self.rank} ({self.host})" if self.host else f"rank {self.rank}"


@dataclass(frozen=True)
class RecoveryRecord:
    """A rank replaced in place (dist.recovery=in_process): where, why and what it cost."""

    step: float
    rank: int | None
    cause: str
    seconds: float

    def label(self) -> str:
        """`rank R: CAUSE, S s`, for the mark on the loss curve."""
        who = "a rank" if self.rank is None else f"rank {self.rank}"
        return f"{who}: {self.cause}, {self.seconds:.1f} s"


@dataclass(frozen=True)
class Metrics:
    """Every train and val curve in a metrics.jsonl, its straggler records, and how many
    mid-file lines were unparsable."""

    train: Mapping[str, Series]
    val: Mapping[str, Series]
    bad_lines: int = 0
    stragglers: tuple[StragglerRecord, ...] = ()
    recoveries: tuple[RecoveryRecord, ...] = ()

    def summary(self) -> str:
        """Final step, loss and val metrics on one line, noting any skipped bad lines."""
        loss = self.train["loss"]
        parts = [f"step {loss.steps[-1]:g}", f"loss {loss.values[-1]:.4g}"]
        parts += [f"{name} {series.values[-1]:.4g}" for name, series in self.val.items()]
        if self.bad_lines:
            parts.append(f"{self.bad_lines} unparsable line(s) skipped")
        return " · ".join(parts)


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Draw each RUN_DIR's metrics.jsonl into one PNG and print where it went."""
    output = Path(args.output) if args.output else None
    # A run kept in a store: its files (not its checkpoints) are fetched to read them here.
    local = [reading.localise(run_dir, env, what="RUN_DIR", checkpoint=False)
             for run_dir in args.run_dir]  # fmt: skip
    print(render([Path(run_dir) for run_dir in local], output))
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", nargs="+", help="one run, or several to compare"
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="PNG path (default: RUN_DIR/report.png; ./report.png for several runs)",
    )


COMMAND = Command(
    name="report", arguments=_arguments, handler=main, overrides=False,
    help="draw runs' loss and metric curves to one PNG",
)  # fmt: skip


def _is_number(value: object) -> TypeGuard[float]:
    # bool is an int to Python but never a metric; inf would wreck axis autoscaling.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_metrics(path: Path) -> Metrics:
    """Parse metrics.jsonl; a cut-off last line is ignored, other bad lines are counted."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    points: dict[str, dict[str, list[tuple[float, float]]]] = {"train": {}, "val": {}}
    bad = 0
    stragglers: list[StragglerRecord] = []
    recoveries: list[RecoveryRecord] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record: Any = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            bad += i != last  # a killed writer leaves a cut-off last line: expected, not news
            continue
        kind, step = record.get("kind"), record.get("step")
        if kind == "straggler" and _is_number(step) and isinstance(record.get("rank"), int):
            stragglers.append(StragglerRecord(step=step, rank=record["rank"],
                                              host=str(record.get("host", "")),
                                              cause=str(record.get("cause", ""))))  # fmt: skip
        if kind == "recovery" and _is_number(step):
            seconds, rank = record.get("seconds"), record.get("rank")
            recoveries.append(RecoveryRecord(
                step=step, rank=rank if isinstance(rank, int) else None,
                cause=str(record.get("cause", "")),
                seconds=seconds if _is_number(seconds) else math.nan,
            ))  # fmt: skip
        if kind not in points or not _is_number(step):
            continue
        for key, value in record.items():
            # val lines also carry bookkeeping; only val_* fields are validation metrics
            curve = kind == "train" or key.startswith("val_")
            if curve and key not in _NOT_CURVES and _is_number(value):
                points[kind].setdefault(key, []).append((step, value))
    train, val = ({k: Series(*zip(*v, strict=True)) for k, v in p.items()} for p in points.values())
    return Metrics(train=train, val=val, bad_lines=bad, stragglers=tuple(stragglers),
                   recoveries=tuple(recoveries))  # fmt: skip


def _load(run_dir: Path) -> Metrics:
    path = run_dir / METRICS_FILE
    if run_dir.is_file():
        raise UsageError(
            f"{run_dir} is a file, not a run directory",
            hint="pass the run's directory (the one holding metrics.jsonl)",
        )
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist", hint="pass the run's directory")
    if not path.is_file():
        raise UsageError(
            f"{path} does not exist", hint="a run writes it from its first logged step on"
        )
    try:
        metrics = read_metrics(path)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", hint="check its mode") from exc
    if "loss" not in metrics.train:
        raise UsageError(
            f"{path} has no train line with a step and a loss",
            hint="wait for the run to log its first train step, or point at a trainbox run",
        )
    return metrics


# Above this many points a loss curve is noisy enough to need smoothing to be read.
SMOOTH_FROM = 12


def smooth(values: Sequence[float], *, weight: float | None = None) -> list[float]:
    """TensorBoard's debiased exponential moving average; the weight grows with the length."""
    if weight is None:
        weight = min(0.9, max(0.0, 1 - 8 / max(len(values), 1)))
    out, last, scale = [], 0.0, 0.0
    for value in values:
        last = weight * last + (1 - weight) * value
        scale = weight * scale + (1 - weight)
        out.append(last / scale if scale else value)
    return out


def _curve(axes: Axes, series: Series | None, label: str, **style: Any) -> list[Any]:
    return [] if series is None else axes.plot(series.steps, series.values, label=label, **style)


def _panel(axes: Axes, title: str, ylabel: str, handles: list[Any]) -> None:
    axes.set(title=title, xlabel="step (optimizer steps)", ylabel=ylabel)
    axes.grid(alpha=0.3)
    if handles:
        axes.legend(handles=handles, loc="best", fontsize="small")
    else:  # say so rather than leave a blank box that looks like a rendering bug
        axes.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axes.transAxes)


def _loss(axes: Axes, runs: Mapping[str, Metrics]) -> None:
    handles: list[Any] = []
    several = len(runs) > 1
    for index, (name, metrics) in enumerate(runs.items()):
        color, loss = f"C{index}", metrics.train["loss"]
        prefix = f"{name}: " if several else ""
        if len(loss.values) >= SMOOTH_FROM:
            # The raw curve stays, faint, so spikes the average hides are still there to see.
            axes.plot(loss.steps, loss.values, color=color, alpha=0.25, linewidth=0.8)
            smoothed = Series(loss.steps, tuple(smooth(loss.values)))
            handles += _curve(axes, smoothed, f"{prefix}train loss (smoothed)", color=color)
        else:
            handles += _curve(axes, loss, f"{prefix}train loss", color=color, linewidth=1)
        handles += _curve(axes, metrics.val.get("val_loss"), f"{prefix}val_loss (at each eval)",
                          color=color, marker="o", linestyle="--")  # fmt: skip
        handles += _recoveries(axes, metrics.recoveries, prefix=prefix)
    _panel(axes, "Loss", "loss", handles)


def _recoveries(axes: Axes, recoveries: Sequence[RecoveryRecord], *, prefix: str) -> list[Any]:
    """A dotted line at each in-place recovery, labelled with the rank, cause and seconds."""
    handles: list[Any] = []
    for index, recovery in enumerate(recoveries):
        mark = axes.axvline(recovery.step, color="C2", linestyle=":", linewidth=1.2)
        axes.annotate(f"{prefix}{recovery.label()}", xy=(recovery.step, 0.02),
                      xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                      va="bottom", ha="right", color="C2")  # fmt: skip
        if index == 0:
            mark.set_label(f"{prefix}rank replaced in place")
            handles.append(mark)
    return handles


def _validation(axes: Axes, runs: Mapping[str, Metrics]) -> None:
    handles: list[Any] = []
    markers = "osD^v"
    for index, (name, metrics) in enumerate(runs.items()):
        scores = [(n, s) for n, s in metrics.val.items() if n != "val_loss"]
        for number, (metric, series) in enumerate(scores):
            label = f"{name}: {metric}" if len(runs) > 1 else metric
            handles += _curve(axes, series, label, color=f"C{index}",
                              marker=markers[number % len(markers)])  # fmt: skip
    _panel(axes, "Validation metrics (at each eval)", "value", handles)


def _per_run(axes: Axes, runs: Mapping[str, Metrics], key: str, label: str) -> list[Any]:
    handles: list[Any] = []
    for index, (name, metrics) in enumerate(runs.items()):
        shown = f"{name}: {label}" if len(runs) > 1 else label
        handles += _curve(axes, metrics.train.get(key), shown, color=f"C{index}")
    return handles


def _throughput(axes: Axes, runs: Mapping[str, Metrics]) -> None:
    speed = _per_run(axes, runs, "samples_per_s", "samples/s")
    (only,) = runs.values() if len(runs) == 1 else (None,)
    if only is not None and "data_wait_share" in only.train:
        # a 0..1 share next to hundreds of samples/s needs its own axis
        wait_ax = axes.twinx()
        speed += _curve(wait_ax, only.train["data_wait_share"], "data wait share", color="C3",
                        alpha=0.7)  # fmt: skip
        wait_ax.set(ylabel="data wait share", ylim=(0, 1))
        # the twin draws last, so lift the main axes or its curve would cover the legend
        axes.set_zorder(wait_ax.get_zorder() + 1)
        axes.patch.set_visible(False)
    _panel(axes, "Throughput", "samples/s", speed)


def _step_times(axes: Axes, runs: Mapping[str, Metrics]) -> None:
    """Per-rank compute per step: the median rank's line, the band from the fastest to the
    slowest rank, the slowest rank's line, the own time of the rank the others waited for, and
    each straggler record marked with its rank."""
    handles: list[Any] = []
    several = len(runs) > 1
    for index, (name, metrics) in enumerate(runs.items()):
        color, train = f"C{index}", metrics.train
        prefix = f"{name}: " if several else ""
        low, high = train.get("compute_s_min"), train.get("compute_s_max")
        if low is not None and high is not None and low.steps == high.steps:
            band = f"{prefix}fastest to slowest rank"
            handles.append(axes.fill_between(low.steps, low.values, high.values, color=color,
                                             alpha=0.2, label=band))  # fmt: skip
        handles += _curve(axes, train.get("compute_s_p50"), f"{prefix}median rank", color=color)
        handles += _curve(axes, high, f"{prefix}slowest rank", color=color, linestyle="--")
        # Own time (compute, data wait, outside the step, paused) names the straggler: a rank
        # paused inside the collective shows here and not in its compute.
        handles += _curve(axes, train.get("own_s_max"), f"{prefix}the rank waited for: its own"
                          " time", color="C3", linestyle="-.", linewidth=1.0)  # fmt: skip
        handles += _curve(axes, train.get("step_time_s"), f"{prefix}wall step time",
                          color=color, alpha=0.4, linewidth=0.8, linestyle=":")  # fmt: skip
        for straggler in metrics.stragglers:
            mark = axes.axvline(straggler.step, color="C3", alpha=0.8, linewidth=1.2)
            axes.annotate(f"{prefix}{straggler.label()}: {straggler.cause}",
                          xy=(straggler.step, 1.0), xycoords=("data", "axes fraction"),
                          xytext=(3, -12), textcoords="offset points", color="C3",
                          fontsize="small", rotation=0)  # fmt: skip
            if not any(h.get_label() == "straggler named" for h in handles):
                mark.set_label("straggler named")
                handles.append(mark)
    if any("compute_s_p50" in metrics.train for metrics in runs.values()):
        # A straggler is often many times the median: both stay readable on a log scale.
        axes.set_yscale("log")
    _panel(axes, "Per-rank compute per step", "seconds per step", handles)


def _timed(runs: Mapping[str, Metrics]) -> bool:
    return any("compute_s_p50" in metrics.train or metrics.stragglers for metrics in runs.values())


def draw(figure: Figure, title: str, runs: Mapping[str, Metrics]) -> None:
    """The four panels (five with per-rank step times), each run in its own colour (runs: label
    -> its metrics)."""
    figure.suptitle(title)
    if _timed(runs):
        grid = figure.subplot_mosaic([["loss", "val"], ["lr", "speed"], ["steps", "steps"]])
        loss_ax, val_ax, lr_ax, speed_ax = (grid[key] for key in ("loss", "val", "lr", "speed"))
        _step_times(grid["steps"], runs)
    else:
        loss_ax, val_ax, lr_ax, speed_ax = figure.subplots(2, 2).flat
    _loss(loss_ax, runs)
    _validation(val_ax, runs)
    _panel(lr_ax, "Learning rate", "lr", _per_run(lr_ax, runs, "lr", "lr"))
    _throughput(speed_ax, runs)


def _write_atomically(figure: Figure, output: Path) -> None:
    # Viewers and artifact uploaders must never see a half-written PNG under the final name.
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=100)
    atomic.write(output, [png.getvalue()])


def names(run_dirs: Sequence[Path]) -> list[str]:
    """Short, distinct labels for runs: the folder name, with its parent where names repeat."""
    short = [path.resolve().name for path in run_dirs]
    return [
        name if short.count(name) == 1 else f"{path.resolve().parent.name}/{name}"
        for name, path in zip(short, run_dirs, strict=True)
    ]


def render(run_dirs: Path | Sequence[Path], output: Path | None = None) -> Path:
    """Draw each RUN_DIR/metrics.jsonl into one PNG; return its path.

    One run: RUN_DIR/report.png by default; several, overlaid: ./report.png by default.
    """
    dirs = [run_dirs] if isinstance(run_dirs, Path) else list(run_dirs)
    runs = dict(zip(names(dirs), (_load(path) for path in dirs), strict=True))
    if output is None:
        output = dirs[0] / "report.png" if len(dirs) == 1 else Path("report.png")
    if not output.parent.is_dir():
        raise UsageError(f"{output.parent} is not a directory", hint="create it or pick another")
    try:  # lazily, so `import trainbox.commands.report` works where the plot extra is not installed
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UsageError(
            "matplotlib is not installed, so `trainbox report` cannot draw",
            hint="pip install 'trainbox[plot]' (or matplotlib) into the image",
        ) from exc
    figure = Figure(figsize=(12, 12 if _timed(runs) else 8), layout="constrained")
    FigureCanvasAgg(figure)  # Agg directly: no pyplot, no global backend switch
    title = "\n".join(f"{name} · {metrics.summary()}" for name, metrics in runs.items())
    draw(figure, title, runs)
    try:
        _write_atomically(figure, output)
    except OSError as exc:
        raise UsageError(
            f"cannot write {output}: {exc.strerror or exc}", hint="pick a writable --output"
        ) from exc
    return output
