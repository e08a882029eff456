"""README.md is a landing page: short, and its first commands are the two set-up commands
(the example, and the tests that CI runs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
FIRST_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)


def test_the_readme_is_about_200_lines_at_most() -> None:
    assert len(README.read_text().splitlines()) <= 200


def test_the_first_commands_are_the_example_and_the_tests() -> None:
    first = FIRST_BLOCK.search(README.read_text())
    assert first is not None
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["./scripts/example", "./scripts/test"]


def test_ci_runs_the_test_command_the_readme_shows() -> None:
    assert re.search(
        r"^(TRAINBOX_\w+=\S+ )*\./scripts/test\b", (ROOT / ".ci" / "run").read_text(), re.M
    )
