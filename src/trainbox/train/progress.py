"""A one-line progress bar for people at a terminal; off a terminal the JSON log lines suffice."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Redraws `step/total` with loss and throughput on one terminal line (rank 0 only)."""

    def __init__(self, total: int, *, enabled: bool, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.enabled = enabled and self.stream.isatty()
        self.started = time.monotonic()

    def update(self, step: int, **values: float) -> None:
        """Show progress after `step` optimizer steps."""
        if not self.enabled:
            return
        width = 30
        filled = width * step // self.total
        shown = "  ".join(f"{key} {value:.4g}" for key, value in values.items())
        elapsed = time.monotonic() - self.started
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r[{bar}] {step}/{self.total}  {shown}  {elapsed:.0f}s ")
        self.stream.flush()

    def close(self) -> None:
        """End the line so later output starts on a fresh one."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
