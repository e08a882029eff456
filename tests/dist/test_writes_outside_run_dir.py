"""A run writes its files to run_dir and its one cache under HOME, and says where: nothing is
left in the temporary directory (under Apptainer, the node's /tmp, shared by every job)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runs import QUICK, train

pytestmark = pytest.mark.slow


def home_and_tmp(tmp_path: Path) -> tuple[Path, Path]:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    return home, tmp


MODES = pytest.mark.parametrize(
    "mode", [[], ["dist.procs_per_node=2"]], ids=["one-process", "node-mode"]
)


@MODES
def test_a_run_leaves_nothing_in_tmp(tmp_path: Path, mode: list[str]) -> None:
    home, tmp = home_and_tmp(tmp_path)
    train(tmp_path / "run", *QUICK, *mode, env={"HOME": str(home), "TMPDIR": str(tmp)})
    assert sorted(tmp.rglob("*")) == []


@MODES
def test_a_run_logs_its_compile_cache_under_home_once(tmp_path: Path, mode: list[str]) -> None:
    home, tmp = home_and_tmp(tmp_path)
    proc = train(tmp_path / "run", *QUICK, *mode, env={"HOME": str(home), "TMPDIR": str(tmp)})
    cache = home / ".cache" / "trainbox" / "torchinductor"
    logged = [
        json.loads(line)
        for line in proc.stderr.splitlines()
        if line.startswith('{"') and '"compile cache"' in line
    ]
    assert [(e["path"], e["source"]) for e in logged] == [(str(cache), "HOME")], proc.stderr
    assert [p.relative_to(home) for p in sorted(home.rglob("*"))] == [
        Path(".cache"),
        Path(".cache/trainbox"),
        Path(".cache/trainbox/torchinductor"),
    ]
