"""Test modules outside a package are imported by their file name alone (pytest's rootdir-based
import), so two with one name in different folders stop the whole collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_plain_test_modules_share_a_file_name() -> None:
    plain = [
        path.name for path in TESTS.rglob("test_*.py") if not (path.parent / "__init__.py").exists()
    ]
    assert [name for name, count in Counter(plain).items() if count > 1] == []
