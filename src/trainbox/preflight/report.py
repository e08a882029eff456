"""One node's findings under the run's policy: which failures are fatal, which exit code, and
which rank logs a warning (the checks' declarations are in config/preflight_checks.py)."""

from __future__ import annotations

from dataclasses import dataclass

from trainbox.config.preflight_checks import CONFIG_CHECKS, NODE_WIDE
from trainbox.errors import PreflightError, UsageError
from trainbox.preflight.checks import Check


def worth_logging(name: str, *, local_rank: int) -> bool:
    """Whether this rank logs a warning from check `name` (node findings: local rank 0 only)."""
    return name not in NODE_WIDE or local_rank == 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    """All checks of one node, with the policy that decides which failures are fatal."""

    # Every check, in judge() order.
    checks: tuple[Check, ...]
    # Names whose `fail` stops the run (preflight.fatal).
    fatal_names: frozenset[str]

    @property
    def fatal(self) -> tuple[Check, ...]:
        """Failed checks that policy makes fatal."""
        return tuple(c for c in self.checks if c.status == "fail" and c.name in self.fatal_names)

    def describe(self) -> list[dict[str, str]]:
        """Plain data for doctor's JSON; a non-fatal failure is shown as a warning."""
        return [
            {
                "name": c.name,
                "status": "warn"
                if c.status == "fail" and c.name not in self.fatal_names
                else c.status,
                "message": c.message,
                **({"hint": c.hint} if c.hint and c.status in ("warn", "fail") else {}),
            }
            for c in self.checks
        ]

    def raise_if_fatal(self) -> None:
        """Exit 3 with every fatal finding on one line (exit 2 when only the config is at fault)."""
        if not self.fatal:
            return
        problems = [f"{c.name}: {c.message}" for c in self.fatal]
        hint = " / ".join(dict.fromkeys(c.hint for c in self.fatal if c.hint))
        if all(c.name in CONFIG_CHECKS for c in self.fatal):
            raise UsageError(problems, hint=hint)
        raise PreflightError(problems, hint=hint)
