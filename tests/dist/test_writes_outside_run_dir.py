"""A run writes its files to run_dir and its one cache under HOME, and says where: nothing is
left in the temporary directory (under Apptainer, the node's /tmp, shared by every job)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from runs import QUICK, train

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Run:
    """A finished run, with HOME and TMPDIR folders of its own."""

    home: Path
    tmp: Path
    proc: subprocess.CompletedProcess[str]


# One run per mode serves every test of the mode.
@pytest.fixture(
    scope="module", params=[[], ["dist.procs_per_node=2"]], ids=["one-process", "node-mode"]
)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    base = tmp_path_factory.mktemp("outside")
    home, tmp = base / "home", base / "tmp"
    home.mkdir()
    tmp.mkdir()
    proc = train(base / "run", *QUICK, *request.param, env={"HOME": str(home), "TMPDIR": str(tmp)})
    return Run(home, tmp, proc)


def test_a_run_leaves_nothing_in_tmp(run: Run) -> None:
    assert sorted(run.tmp.rglob("*")) == []


def test_a_run_logs_its_compile_cache_under_home_once(run: Run) -> None:
    cache = run.home / ".cache" / "trainbox" / "torchinductor"
    logged = [
        json.loads(line)
        for line in run.proc.stderr.splitlines()
        if line.startswith('{"') and '"compile cache"' in line
    ]
    assert [(e["path"], e["source"]) for e in logged] == [(str(cache), "HOME")], run.proc.stderr
    assert [p.relative_to(run.home) for p in sorted(run.home.rglob("*"))] == [
        Path(".cache"),
        Path(".cache/trainbox"),
        Path(".cache/trainbox/torchinductor"),
    ]
