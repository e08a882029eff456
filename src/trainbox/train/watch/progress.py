"""A one-line progress display for people at a terminal; off a terminal the JSON log lines suffice.

Hand-written rather than tqdm or rich: it redraws only at log points (every `train.log_every`
steps), where those libraries' own rate and refresh logic has nothing to do, and the real work is
sharing the line with structlog's console output, which `trainbox.logs` does for both.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping
from typing import TextIO

from trainbox.logs import status_line


def eta(done: int, left: int, seconds: float) -> str:
    """`left` steps at the pace of `done` steps in `seconds`, as `1h02m`, `3m04s` or `12s`."""
    if done <= 0 or seconds <= 0:
        return "--"
    remaining = round(left * seconds / done)
    hours, rest = divmod(remaining, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def line(step: int, total: int, values: Mapping[str, float], *, eta_text: str) -> str:
    """The progress line: bar, step/total, values to 4 significant digits, ETA."""
    width = 20
    filled = width * min(step, total) // max(total, 1)
    shown = "  ".join(
        f"{key.replace('_per_s', '/s')} {_num(value)}" for key, value in values.items()
    )
    return f"[{'#' * filled}{'.' * (width - filled)}] {step}/{total}  {shown}  ETA {eta_text}"


def _num(value: float) -> str:
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{value:,.0f}"  # 29,570 reads better than 2.957e+04
    return f"{value:.4g}"


class Progress:
    """Redraws `step/total` with loss, throughput, ETA and the last eval (rank 0, on a TTY)."""

    def __init__(self, total: int, *, enabled: bool, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.enabled = enabled and self.stream.isatty()
        # The pace is measured from the first update: the steps before it (a resume, DDP's
        # settling) would skew it.
        self.first: tuple[int, float] | None = None
        self.values: dict[str, float] = {}
        self.evaluated: dict[str, float] = {}
        self.step = 0

    def update(self, step: int, **values: float) -> None:
        """Show progress after `step` optimizer steps."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = (step, now)
        self.step, self.values = step, dict(values)
        done, since = step - self.first[0], now - self.first[1]
        self._draw(eta(done, self.total - step, since))

    def eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """Keep the validation metrics of `step` on the line until the next eval."""
        if not self.enabled:
            return
        self.evaluated = {
            key: value
            for key, value in metrics.items()
            if key.startswith("val_") and key != "val_samples"  # a count, not a metric
        }
        self.step = max(self.step, step)
        if self.first is not None:
            done, since = self.step - self.first[0], time.monotonic() - self.first[1]
            self._draw(eta(done, self.total - self.step, since))

    def close(self) -> None:
        """Keep the last line as it is; later output starts on a fresh one."""
        if self.enabled:
            status_line.release()

    def _draw(self, eta_text: str) -> None:
        text = line(self.step, self.total, {**self.values, **self.evaluated}, eta_text=eta_text)
        # A line wider than the terminal wraps, and the redraw would then erase only its end.
        columns = _columns(self.stream)
        status_line.show(self.stream, text[: columns - 1] if columns else text)


def _columns(stream: TextIO) -> int:
    # 0 when unknown (a pseudo-terminal nobody sized): then the line is not cut.
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0
