"""Preemption requests: stop signals and the Slurm deadline.

No torch here: the CLI installs the handlers before anything else starts.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from types import FrameType

from trainbox.errors import UsageError

# Slurm (scancel --signal, --signal=B:USR1@lead forwarded by our sbatch scripts) sends USR1;
# Kubernetes, docker stop and torchrun's agent send TERM.
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Vote values: the all-reduce takes the maximum, so every rank reports the same reason.
REASONS = ("", "deadline", "SIGUSR1", "SIGTERM")
# Set by the node-mode supervisor: it watches the deadline itself and signals its agent, so
# workers stopping on their own (and being restarted by torchrun) cannot race it.
SUPERVISED = "TRAINBOX_SUPERVISED"


def deadline(env: Mapping[str, str], *, margin_s: float) -> float | None:
    """When to stop, in epoch seconds: Slurm's SLURM_JOB_END_TIME minus the margin, or None."""
    if env.get(SUPERVISED) == "1":
        return None
    raw = env.get("SLURM_JOB_END_TIME", "").strip()
    if not raw:
        return None
    try:
        end = float(raw)
    except ValueError:
        raise UsageError(
            f"SLURM_JOB_END_TIME={raw!r} is not a time in seconds since the epoch",
            hint="unset it, or let Slurm set it (sbatch/srun do)",
        ) from None
    # Slurm sets 0 or a far-future value for jobs without a time limit; neither is a deadline.
    if end <= 0 or end > time.time() + 10 * 365 * 86400:
        return None
    return end - margin_s


def settle() -> None:
    """The outcome is decided: stop signals from here to exit change nothing (no death by them).

    Python puts SIG_DFL back for every signal with a Python handler when the interpreter shuts
    down, and torch's teardown makes that window long enough for a scheduler's late signal to
    land and kill a finished run. SIG_IGN is the one setting shutdown leaves alone.
    """
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class Requests:
    """Remembers the strongest stop signal received; `install()` hooks it up for this process."""

    def __init__(self) -> None:
        self.code = 0

    def install(self) -> Callable[[], None]:
        """Catch SIGTERM and SIGUSR1 from now on; the function returned restores the old ones."""
        previous = {sig: signal.signal(sig, self._record) for sig in SIGNALS}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    def _record(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.code = max(self.code, REASONS.index(signal.Signals(signum).name))
