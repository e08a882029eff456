"""An error is one line whatever the names it quotes hold: paths and labels may hold breaks."""

from __future__ import annotations

import pytest

from trainbox.errors import UsageError


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("a\nb", "a\\nb"),
        ("a\rb", "a\\rb"),
        ("a\x0bb\x0cc", "a\\x0bb\\x0cc"),
        ("a\x1cb\x1dc\x1ed", "a\\x1cb\\x1dc\\x1ed"),
        ("a\x85b", "a\\x85b"),
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),
        ("tab\there é", "tab\there é"),
    ],
)
def test_a_name_with_a_line_break_is_shown_escaped(name: str, shown: str) -> None:
    line = UsageError(f"/data/{name} has no files", hint=f"fix /data/{name}").line()
    assert line.splitlines() == [line]
    assert line == f"/data/{shown} has no files. HINT: fix /data/{shown}"
