"""Problems a built-in data factory finds in the user's files, collected and raised once."""

from __future__ import annotations

from trainbox.errors import UsageError

# Enough to see a pattern in a bad file without pages of lines.
MAX_PROBLEMS = 10


class Problems(list[str]):
    """Problems found so far; keeps the first MAX_PROBLEMS and counts the rest."""

    dropped = 0

    def add(self, problem: str) -> None:
        if len(self) < MAX_PROBLEMS:
            self.append(problem)
        else:
            self.dropped += 1

    def raise_any(self, hint: str) -> None:
        """One UsageError listing them (and how many more), if there are any."""
        if self:
            more = [f"and {self.dropped} more"] if self.dropped else []
            raise UsageError([*self, *more], hint=hint)
