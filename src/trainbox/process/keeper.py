"""dist.recovery=in_process, the process side: each worker torchrun starts becomes its rank's
keeper. It runs the rank's trainer and a warm spare (the same command, torch imported, model and
data built, waiting); when the trainer dies, the spare takes its rank and a new spare starts.

torchrun never sees the trainer die, so it does not restart the node's workers: the survivors
re-form the process group with the spare in memory (distributed/regroup.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType

from trainbox.logs import log

# What a kept process is: "trainer" trains the rank; "spare" waits to take it over.
ROLE = "TRAINBOX_ROLE"
# The spare's end of the pipe its keeper writes the promotion to (one JSON line).
SPARE_FD = "TRAINBOX_SPARE_FD"
# A process lost, not a decision: the kernel's OOM killer or a kill -9, a crash in native code.
# Every other exit (a clean stop, a bad config, a hang the job agreed on) is the rank's answer.
REPLACEABLE = frozenset(
    {signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}
)
# How often the keeper looks at its children. A death is seen within this; the survivors find
# it through their sockets meanwhile, so it is not on the recovery's critical path.
POLL_S = 0.02
# Passed on to the trainer; torchrun's agent sends them to the workers it started.
FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True, kw_only=True, slots=True)
class Promotion:
    """What a spare is told when it takes over its rank."""

    # The pids that held this rank before, oldest first; the last one just died.
    predecessors: tuple[int, ...]
    # Why the last one ended, e.g. "SIGKILL" or "stopped".
    cause: str
    # Epoch seconds when the keeper saw it end.
    died_at: float

    def to_line(self) -> bytes:
        """The one line a keeper writes down the spare's pipe."""
        fields = {"predecessors": list(self.predecessors), "cause": self.cause}
        return (json.dumps({**fields, "died_at": self.died_at}) + "\n").encode()

    @staticmethod
    def from_line(line: bytes) -> Promotion:
        """The keeper's line back as a Promotion."""
        fields = json.loads(line)
        return Promotion(
            predecessors=tuple(int(pid) for pid in fields["predecessors"]),
            cause=str(fields["cause"]),
            died_at=float(fields["died_at"]),
        )


def kept(env: Mapping[str, str], *, recovery: str) -> bool:
    """Whether this process should become a keeper: a torchrun worker of node mode, with
    dist.recovery=in_process, that is not itself a kept trainer or spare."""
    under_agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and "RANK" in env
    return recovery == "in_process" and under_agent and ROLE not in env


def cause_of(returncode: int) -> str | None:
    """The cause to replace a trainer for, from Popen's returncode (None: its exit stands)."""
    if returncode >= 0:
        return None
    sig = signal.Signals(-returncode)
    return sig.name if sig in REPLACEABLE else None


class Keeper:
    """Runs one rank's trainer and spare until the trainer's exit stands."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        max_recoveries: int,
        stopped_polls: int,
        popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    ) -> None:
        self.command, self.env, self.popen = list(command), dict(env), popen
        self.max_recoveries = max_recoveries
        # A trainer seen stopped (SIGSTOP, a frozen container) this many polls in a row is
        # killed and replaced. Polls, not wall time: a whole job suspended stops this too.
        self.stopped_polls = stopped_polls
        self.trainer: subprocess.Popen[bytes] | None = None
        self.spare: tuple[subprocess.Popen[bytes], int] | None = None
        self.pids: list[int] = []

    def run(self) -> int:
        """The trainer's exit code once it stands (a replaced trainer's is never returned)."""
        before = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}
        try:
            return self._keep()
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def _keep(self) -> int:
        self.trainer = self._start("trainer")
        self.pids.append(self.trainer.pid)
        self.spare = self._start_spare() if self.max_recoveries else None
        recoveries = 0
        try:
            while True:
                returncode, cause, since = self._wait_trainer()
                if cause is None or recoveries >= self.max_recoveries or self.spare is None:
                    return returncode if returncode >= 0 else 128 - returncode
                recoveries += 1
                self._promote(cause, since)
                if recoveries < self.max_recoveries:
                    self.spare = self._start_spare()
        finally:
            self._end_spare()

    def _wait_trainer(self) -> tuple[int, str | None, float]:
        """Wait for the trainer to end (or be judged stopped): its returncode, the cause to
        replace it for, and since when it was lost (epoch seconds)."""
        assert self.trainer is not None
        stopped, stopped_at = 0, 0.0
        while True:
            pid, status = os.waitpid(self.trainer.pid, os.WNOHANG | os.WUNTRACED)
            if pid and os.WIFSTOPPED(status):
                stopped, stopped_at = stopped + 1, time.time()
            elif pid:
                self.trainer.returncode = os.waitstatus_to_exitcode(status)
                return self.trainer.returncode, cause_of(self.trainer.returncode), time.time()
            elif stopped and _stopped(self.trainer.pid):
                stopped += 1
            else:
                stopped = 0
            if stopped >= self.stopped_polls:
                log.warning("trainer stopped: killing it", pid=self.trainer.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.trainer.pid, signal.SIGKILL)
                self.trainer.wait()
                # Its recovery is timed from the stop: that is when its peers lost it.
                return self.trainer.returncode, "stopped", stopped_at
            self._check_spare()
            time.sleep(POLL_S)

    def _check_spare(self) -> None:
        """A spare that died while waiting is started again (it holds nothing yet)."""
        if self.spare is not None and self.spare[0].poll() is not None:
            log.warning(
                "spare ended while waiting: starting another", code=self.spare[0].returncode
            )
            os.close(self.spare[1])
            self.spare = self._start_spare()

    def _promote(self, cause: str, since: float) -> None:
        assert self.spare is not None
        spare, pipe = self.spare
        promotion = Promotion(predecessors=tuple(self.pids), cause=cause, died_at=since)
        log.warning("trainer lost: its spare takes over", cause=cause, spare=spare.pid)
        # A spare that died just now fails to join; the next spare is promoted for it.
        with contextlib.suppress(BrokenPipeError):
            os.write(pipe, promotion.to_line())
        os.close(pipe)
        self.trainer, self.spare = spare, None
        self.pids.append(spare.pid)

    def _start(self, role: str, **kwargs: object) -> subprocess.Popen[bytes]:
        env = {**self.env, ROLE: role, **kwargs.pop("env", {})}  # type: ignore[dict-item]
        return self.popen(self.command, env=env, **kwargs)

    def _start_spare(self) -> tuple[subprocess.Popen[bytes], int]:
        read, write = os.pipe()
        try:
            spare = self._start("spare", env={SPARE_FD: str(read)}, pass_fds=(read,))
        finally:
            os.close(read)
        return spare, write

    def _end_spare(self) -> None:
        if self.spare is None:
            return
        spare, pipe = self.spare
        # Closing the pipe tells a waiting spare to leave; a spare still importing is killed.
        os.close(pipe)
        with contextlib.suppress(ProcessLookupError):
            spare.send_signal(signal.SIGKILL)
        spare.wait()
        self.spare = None

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.send_signal(signum)


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped now (state T in /proc); a reaped one is not."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False
