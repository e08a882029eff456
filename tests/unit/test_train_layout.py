"""Where things live in train/ and checkpoint/: the loop reaches signals, faults and the watchdog
only through its run control, and one module builds and reads the checkpoint payload, for
train/ and infer/ alike."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "trainbox"


def imported(path: Path) -> set[str]:
    """Every module a file imports, `from a import b` counted as both a and a.b."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize(
    "module",
    ["trainbox.testing.faults", "trainbox.watchdog", "trainbox.process.preempt"],
)
def test_the_loop_reaches_faults_watchdog_and_signals_only_through_its_run_control(
    module: str,
) -> None:
    assert module not in imported(SRC / "train" / "loop.py")


def test_only_the_schema_names_payload_keys() -> None:
    # A reader that indexes the raw dict re-derives the schema; it must go through Payload.
    pattern = re.compile(r"""payload(\.get\(|\[)["'](model|step|config|model_config|optimizer)""")
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path != SRC / "checkpoint" / "schema.py" and pattern.search(path.read_text())
    ]
    assert offenders == []


def test_infer_finds_no_checkpoint_file_details_of_its_own() -> None:
    # The sidecar's name and torch.load's options belong to checkpoint/files.py.
    for path in (SRC / "infer").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"""["']\.sha256["']|torch\.load\(""", text), path.name
