"""A run's metrics.jsonl drawn as one PNG of loss, validation, lr and speed (`trainbox report`)."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainbox import atomic
from trainbox.errors import UsageError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
# Bookkeeping fields, not curves worth a line.
_NOT_CURVES = frozenset({"kind", "step", "epoch", "time", "val_samples"})


@dataclass(frozen=True)
class Series:
    """One metric's values and the steps they were logged at."""

    steps: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class Metrics:
    """Every train and val curve in a metrics.jsonl, and how many mid-file lines were unparsable."""

    train: Mapping[str, Series]
    val: Mapping[str, Series]
    bad_lines: int = 0

    def summary(self) -> str:
        """Final step, loss and val metrics on one line, noting any skipped bad lines."""
        loss = self.train["loss"]
        parts = [f"step {loss.steps[-1]:g}", f"loss {loss.values[-1]:.4g}"]
        parts += [f"{name} {series.values[-1]:.4g}" for name, series in self.val.items()]
        if self.bad_lines:
            parts.append(f"{self.bad_lines} unparsable line(s) skipped")
        return " · ".join(parts)


def _is_number(value: object) -> bool:
    # bool is an int to Python but never a metric; inf would wreck axis autoscaling.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_metrics(path: Path) -> Metrics:
    """Parse metrics.jsonl; a cut-off last line is ignored, other bad lines are counted."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    points: dict[str, dict[str, list[tuple[float, float]]]] = {"train": {}, "val": {}}
    bad = 0
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
        if kind not in points or not _is_number(step):
            continue
        for key, value in record.items():
            # val lines also carry bookkeeping; only val_* fields are validation metrics
            curve = kind == "train" or key.startswith("val_")
            if curve and key not in _NOT_CURVES and _is_number(value):
                points[kind].setdefault(key, []).append((step, value))
    train, val = ({k: Series(*zip(*v, strict=True)) for k, v in p.items()} for p in points.values())
    return Metrics(train=train, val=val, bad_lines=bad)


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


def _curve(axes: Axes, series: Series | None, label: str, **style: Any) -> list[Any]:
    return [] if series is None else axes.plot(series.steps, series.values, label=label, **style)


def _panel(axes: Axes, title: str, ylabel: str, handles: list[Any]) -> None:
    axes.set(title=title, xlabel="step", ylabel=ylabel)
    axes.grid(alpha=0.3)
    if handles:
        axes.legend(handles=handles, loc="best", fontsize="small")
    else:  # say so rather than leave a blank box that looks like a rendering bug
        axes.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axes.transAxes)


def _draw(figure: Figure, title: str, metrics: Metrics) -> None:
    figure.suptitle(title)
    loss_ax, val_ax, lr_ax, speed_ax = figure.subplots(2, 2).flat
    train, val = metrics.train, metrics.val
    loss = _curve(loss_ax, train["loss"], "train loss", linewidth=1)
    loss += _curve(loss_ax, val.get("val_loss"), "val_loss", marker="o")
    _panel(loss_ax, "Loss", "loss", loss)
    scores: list[Any] = []
    for name, series in val.items():
        scores += [] if name == "val_loss" else _curve(val_ax, series, name, marker="o")
    _panel(val_ax, "Validation metrics", "value", scores)
    _panel(lr_ax, "Learning rate", "lr", _curve(lr_ax, train.get("lr"), "lr", color="C2"))
    speed = _curve(speed_ax, train.get("samples_per_s"), "samples/s", color="C0")
    if "data_wait_share" in train:  # a 0..1 share next to hundreds of samples/s needs its own axis
        wait_ax = speed_ax.twinx()
        speed += _curve(wait_ax, train["data_wait_share"], "data wait share", color="C3", alpha=0.7)
        wait_ax.set(ylabel="data wait share", ylim=(0, 1))
        # the twin draws last, so lift the main axes or its curve would cover the legend
        speed_ax.set_zorder(wait_ax.get_zorder() + 1)
        speed_ax.patch.set_visible(False)
    _panel(speed_ax, "Throughput", "samples/s", speed)


def _write_atomically(figure: Figure, output: Path) -> None:
    # Viewers and artifact uploaders must never see a half-written PNG under the final name.
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=100)
    atomic.write(output, [png.getvalue()])


def render(run_dir: Path, output: Path | None = None) -> Path:
    """Draw RUN_DIR/metrics.jsonl to a PNG (RUN_DIR/report.png by default); return its path."""
    metrics = _load(run_dir)
    output = run_dir / "report.png" if output is None else output
    if not output.parent.is_dir():
        raise UsageError(f"{output.parent} is not a directory", hint="create it or pick another")
    try:  # lazily, so `import trainbox.curves` works where the plot extra is not installed
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UsageError(
            "matplotlib is not installed, so `trainbox report` cannot draw",
            hint="pip install 'trainbox[plot]' (or matplotlib) into the image",
        ) from exc
    figure = Figure(figsize=(12, 8), layout="constrained")
    FigureCanvasAgg(figure)  # Agg directly: no pyplot, no global backend switch
    _draw(figure, f"{run_dir.resolve().name}\n{metrics.summary()}", metrics)
    try:
        _write_atomically(figure, output)
    except OSError as exc:
        raise UsageError(
            f"cannot write {output}: {exc.strerror or exc}", hint="pick a writable --output"
        ) from exc
    return output
