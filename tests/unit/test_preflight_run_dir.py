"""Whether run_dir could be written, read from the file system as preflight does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainbox.preflight import node


def problem(run_dir: Path) -> str | None:
    return node.read(run_dir=run_dir, master_addr="127.0.0.1").run_dir_problem


def test_a_writable_run_dir_has_no_problem(tmp_path: Path) -> None:
    assert problem(tmp_path / "new" / "run") is None


def test_the_facts_name_run_dir_as_configured() -> None:
    assert node.read(run_dir=Path("runs/example"), master_addr="127.0.0.1").run_dir == (
        "runs/example"
    )


def test_a_folder_that_denies_writes_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "access", lambda *_: False)
    assert problem(tmp_path / "run") == (
        f"run_dir={str(tmp_path / 'run')!r} is not writable ({tmp_path} denies writes)"
    )


def test_a_read_only_file_system_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a container's read-only image (a SIF, docker --read-only) looks like from inside.
    real = os.statvfs(tmp_path)
    fields = [getattr(real, name) for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree",
              "f_bavail", "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")]  # fmt: skip
    fields[8] |= os.ST_RDONLY
    monkeypatch.setattr(os, "access", lambda *_: False)
    monkeypatch.setattr(os, "statvfs", lambda _: os.statvfs_result(fields))
    assert problem(tmp_path / "run") == (
        f"run_dir={str(tmp_path / 'run')!r} is not writable "
        f"({tmp_path} is on a read-only file system)"
    )
