"""The few errors a user can see; each maps to one documented exit code."""

from __future__ import annotations

# Where str.splitlines breaks a line: a path or name quoted in an error may hold any of them,
# and the error must stay one line, so they are shown escaped.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


class TrainboxError(Exception):
    """An error caused by the user's input or the environment, reported without a traceback."""

    exit_code = 1

    def __init__(self, problems: str | list[str], *, hint: str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        """All problems and the hint on one line, as the CLI prints it."""
        return f"{'; '.join(self.problems)}. HINT: {self.hint}".translate(_LINE_BREAKS)


class UsageError(TrainboxError):
    """Bad command line or configuration."""

    exit_code = 2


class LaunchError(UsageError):
    """The launcher's environment is missing, inconsistent or unparsable."""


class StorageError(UsageError):
    """The run directory's storage failed a write (full, read-only, gone); nothing was lost."""


class PreflightError(TrainboxError):
    """A node failed a fatal preflight check."""

    exit_code = 3


class DistributedError(TrainboxError):
    """The job's processes do not agree (versions, config) or cannot meet."""

    exit_code = 4


class Stopped(TrainboxError):
    """Training stopped early for preemption, after every rank agreed and a checkpoint landed."""

    # 128 + SIGTERM: what schedulers expect of a process that was asked to stop (retryable).
    exit_code = 143
