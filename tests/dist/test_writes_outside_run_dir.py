"""A run writes its files to run_dir and its one cache under HOME, and says where: nothing
lands in the shared temporary directory (under Apptainer, the node's own /tmp)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runs import QUICK, train

pytestmark = pytest.mark.slow


def test_a_run_writes_nothing_to_tmp_and_logs_its_compile_cache_under_home(
    tmp_path: Path,
) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    proc = train(tmp_path / "run", *QUICK, env={"HOME": str(home), "TMPDIR": str(tmp)})
    assert sorted(tmp.iterdir()) == []
    cache = home / ".cache" / "trainbox" / "torchinductor"
    logged = [
        json.loads(line)
        for line in proc.stderr.splitlines()
        if line.startswith('{"') and '"compile cache"' in line
    ]
    assert [(e["path"], e["source"]) for e in logged] == [(str(cache), "HOME")], proc.stderr
    assert [p.relative_to(home) for p in home.rglob("*")] == [
        Path(".cache"),
        Path(".cache/trainbox"),
        Path(".cache/trainbox/torchinductor"),
    ]
