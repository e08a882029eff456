"""Stop requests: stop signals, the Slurm deadline and a GPU gone bad.

No torch here: the CLI installs the handlers before anything else starts.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from types import FrameType

from trainbox.errors import UsageError

# Slurm (scancel --signal, --signal=B:USR1@lead forwarded by our sbatch scripts) sends USR1;
# Kubernetes, docker stop and torchrun's agent send TERM; Ctrl-C in a terminal sends INT to
# every process of the foreground job (torchrun's agent and its workers alike).
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# Vote values: the all-reduce takes the maximum, so every rank reports the same reason.
# SIGINT last: under torchrun a worker gets the terminal's INT and then its agent's TERM, and
# the reason should say what the person did.
# A GPU fault outranks them all: its exit 3 tells the scheduler the node is bad, where 143 would
# only requeue the job, perhaps onto the same GPU.
REASONS = ("", "deadline", "SIGUSR1", "SIGTERM", "SIGINT", "GPU fault")
GPU_FAULT = REASONS.index("GPU fault")
FIRST_CTRL_C = (
    b"trainbox: Ctrl-C: stopping after the next agreed step with a checkpoint; press Ctrl-C"
    b" again to abort at once without one\n"
)
SECOND_CTRL_C = b"trainbox: Ctrl-C again: aborting now, without a checkpoint\n"
# Seconds after a Ctrl-C in which another INT is torchrun's echo of it (see ctrl_c_action).
ECHO_S = 2.0
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


class StopRequests:
    """Remembers the strongest stop signal received and this rank's GPU fault; `install()` hooks
    the signals up for this process."""

    def __init__(self) -> None:
        self._signal = 0
        # time.monotonic() of the first Ctrl-C; None before one.
        self.first_ctrl_c_at: float | None = None
        # The first GPU fault seen on this rank, one line naming the GPU and host; None: none.
        self.gpu_fault: str | None = None

    @property
    def code(self) -> int:
        """The strongest request as an index into REASONS (0: none)."""
        return GPU_FAULT if self.gpu_fault is not None else self._signal

    @code.setter
    def code(self, value: int) -> None:
        self._signal = value

    def fault(self, description: str) -> None:
        """This rank's GPU went bad (called from the telemetry thread): stop with exit 3."""
        # Kept apart from the signal code, which a handler rewrites on the main thread: one
        # attribute store, so neither can undo the other.
        if self.gpu_fault is None:
            self.gpu_fault = description

    def install(self) -> Callable[[], None]:
        """Catch SIGTERM, SIGUSR1 and SIGINT from now on; the function returned restores the old
        ones."""
        previous = {sig: signal.signal(sig, self._record) for sig in SIGNALS}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    def _record(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if signum == signal.SIGINT:
            self._interrupted(time.monotonic())
        self._signal = max(self._signal, REASONS.index(signal.Signals(signum).name))

    def _interrupted(self, now: float) -> None:
        action = ctrl_c_action(self.first_ctrl_c_at, now)
        # os.write, not print: a handler may interrupt a print on the main thread.
        if action == "stop":
            self.first_ctrl_c_at = now
            os.write(2, FIRST_CTRL_C)
        elif action == "abort":
            os.write(2, SECOND_CTRL_C)
            # Die of the signal itself, as an uncaught Ctrl-C does: the shell reports 130.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)


def ctrl_c_action(first_at: float | None, now: float, *, echo_s: float = ECHO_S) -> str:
    """What a Ctrl-C means: `stop` (the first), `echo` (the same one again), `abort` (a second).

    torchrun's agent passes the Ctrl-C it got on to its workers, which the terminal signalled
    already: an INT within echo_s of the first is that echo, not a person pressing again.
    """
    if first_at is None:
        return "stop"
    return "echo" if now - first_at < echo_s else "abort"
