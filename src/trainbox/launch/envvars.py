"""Read launcher variables, collecting every problem so they are reported together."""

from __future__ import annotations

from collections.abc import Mapping

from trainbox.errors import LaunchError


class EnvReader:
    """Typed reads from one environment mapping; problems pile up until `raise_if_problems`.

    A bad value reads as 0 and its name is remembered, so callers never use it: they must call
    `raise_if_problems` before building anything from what they read.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []
        self._bad: set[str] = set()

    def first_set(self, *names: str) -> str | None:
        """The first of `names` that is set, or None."""
        return next((name for name in names if name in self.env), None)

    def required_int(self, name: str, *, minimum: int = 0) -> int:
        """The value of `name` as an int ≥ minimum; a missing or bad value is noted as a problem."""
        raw = self.env.get(name)
        if raw is None:
            self._note(name, f"{name} is not set")
            return 0
        return self._parse(name, raw, minimum)

    def optional_int(self, name: str, *, minimum: int = 0) -> int | None:
        """Like `required_int`, but a missing variable is simply None."""
        raw = self.env.get(name)
        return None if raw is None else self._parse(name, raw, minimum)

    def port(self, name: str) -> int:
        """A TCP port (1-65535) read from `name`; missing or bad is a problem."""
        value = self.required_int(name, minimum=1)
        if self.ok(name) and value > 65535:
            self._note(name, f"{name}={value} is not a TCP port (1-65535)")
        return value

    def int_from(self, *names: str, minimum: int = 0) -> tuple[int, str]:
        """The first set variable among `names`, parsed; its name is returned for messages."""
        name = self.first_set(*names) or names[0]
        return self.required_int(name, minimum=minimum), name

    def below(self, name: str, value: int, limit_name: str, limit: int) -> None:
        """Note a problem unless value < limit (skipped when either was already bad).

        A value out of range makes `name` bad, so checks built on it (`ok`) do not run and
        blame a variable that is fine.
        """
        if name not in self._bad and limit_name not in self._bad and value >= limit:
            self._note(name, f"{name}={value} must be less than {limit_name}={limit}")

    def check(self, ok: bool, problem: str) -> None:
        """Note `problem` unless `ok`."""
        if not ok:
            self.problems.append(problem)

    def ok(self, *names: str) -> bool:
        """Whether every named variable read well so far (to skip checks built on a bad one)."""
        return not self._bad.intersection(names)

    def raise_if_problems(self, hint: str) -> None:
        """Raise one LaunchError naming every problem seen so far."""
        if self.problems:
            raise LaunchError(self.problems, hint=hint)

    def _note(self, name: str, problem: str) -> None:
        self._bad.add(name)
        self.problems.append(problem)

    def _parse(self, name: str, raw: str, minimum: int) -> int:
        text = raw.strip()
        digits = text[1:] if text.startswith("-") else text
        if not (digits.isascii() and digits.isdigit()):
            self._note(name, f"{name}={raw!r} is not an integer")
            return 0
        value = int(text)
        if value < minimum:
            self._note(name, f"{name}={value} must be at least {minimum}")
            return 0
        return value
