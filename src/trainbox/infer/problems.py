"""Bad input found on any rank, collected and reported once, the same on every rank."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainbox.errors import UsageError


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One thing wrong with the command's input."""

    # What is wrong, naming the option, key or file.
    text: str
    # What to do about it.
    hint: str


def combined(found: Iterable[Problem]) -> UsageError | None:
    """One UsageError for every distinct problem (first seen first), or None when all is well."""
    texts: list[str] = []
    hints: list[str] = []
    for problem in found:
        # One line, as promised, whatever a problem quotes (torch's messages span paragraphs).
        text, hint = _one_line(problem.text), _one_line(problem.hint)
        if text not in texts:
            texts.append(text)
        if hint not in hints:
            hints.append(hint)
    return UsageError(texts, hint="; ".join(hints)) if texts else None


def _one_line(text: str) -> str:
    return " ".join(text.split())
