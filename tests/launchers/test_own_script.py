"""Bring your own script: examples/own_script.py behind `trainbox exec` under every launcher.

The script is plain DDP (env://, LOCAL_RANK) and never imports trainbox. Each case runs it once
per module (a results cache); per-case tests read its JSON, and runs of one world size must
agree on the trained parameters.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tiers
from freeport import free_port
from launchers import pods
from launchers.slurm_cluster import SlurmCluster
from runs import clean_env

pytestmark = pytest.mark.slow

PYTHON = sys.executable
# Ranks, job steps and pods find `trainbox` and this venv's python first on PATH.
VENV_BIN = Path(PYTHON).parent
SCRIPT = Path(__file__).parents[2] / "examples" / "own_script.py"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--standalone"]
# Slurm cases add this to the cluster's client env; the other launchers get it from clean_env.
SLURM_ENV = {"OMP_NUM_THREADS": clean_env()["OMP_NUM_THREADS"]}
# Generous for a loaded 2-core box; a 4-process run takes about 10 s.
TIMEOUT_S = 180


def _exec_argv(out: Path, *options: str) -> list[str]:
    """`trainbox exec [OPTIONS] -- python examples/own_script.py OUT`."""
    return ["trainbox", "exec", *options, "--", PYTHON, str(SCRIPT), str(out)]


class Runs:
    """Runs each case at most once per module and remembers how it went, failures included."""

    def __init__(self, request: pytest.FixtureRequest, base: Path) -> None:
        self.request = request
        self.base = base
        self.env = clean_env(PATH=f"{VENV_BIN}:{os.environ.get('PATH', os.defpath)}")
        self._done: dict[str, dict[str, Any] | BaseException] = {}

    def slurm(self) -> SlurmCluster:
        """The session's Slurm cluster, started only when a Slurm case first needs it."""
        cluster: SlurmCluster = self.request.getfixturevalue("slurm_cluster")
        return cluster

    def result(self, case: Case) -> dict[str, Any]:
        """The JSON rank 0 of `case` wrote; re-raises the case's skip or failure on every call."""
        if case.id not in self._done:
            out = self.base / case.id / "result.json"
            try:
                case.run(self, out)
                self._done[case.id] = json.loads(out.read_text(encoding="utf-8"))
            # Skips and failures too, so that a broken launcher costs one run, not one per test.
            except (Exception, pytest.skip.Exception, pytest.fail.Exception) as exc:
                self._done[case.id] = exc
        result = self._done[case.id]
        if isinstance(result, BaseException):
            raise result
        return result


@dataclass(frozen=True)
class Case:
    """One launcher invocation of the script, and the world size it must see."""

    id: str
    world_size: int
    # Starts the script so that rank 0 writes to the given path; fails unless the launcher exits 0.
    run: Callable[[Runs, Path], None]


def _local(argv: list[str], runs: Runs) -> None:
    proc = subprocess.run(
        argv, env=runs.env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{proc.stderr[-6000:]}"


def mpirun(runs: Runs, out: Path) -> None:
    """`mpirun -np 2 trainbox exec -- python own_script.py OUT`."""
    tiers.require_commands("mpirun")
    _local([*MPIRUN, "-np", "2", *_exec_argv(out)], runs)


def torchrun(runs: Runs, out: Path) -> None:
    """`torchrun --nproc-per-node 2 --no-python trainbox exec -- python own_script.py OUT`."""
    _local([*TORCHRUN, "--nproc-per-node=2", "--no-python", *_exec_argv(out)], runs)


def srun(tasks_per_node: int, *, procs_per_node: int | None = None) -> Callable[[Runs, Path], None]:
    """`srun -N2 --ntasks-per-node=K trainbox exec`, in node mode when `procs_per_node` is set."""

    def run(runs: Runs, out: Path) -> None:
        cluster = runs.slurm()
        options: list[str] = []
        if procs_per_node is not None:
            # exec takes no overrides: node mode comes from a config file.
            config = out.parent / "node-mode.yaml"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(f"dist: {{procs_per_node: {procs_per_node}}}\n", encoding="utf-8")
            options = ["--config", str(config)]
        argv = ["srun", "-N2", f"--ntasks-per-node={tasks_per_node}", *_exec_argv(out, *options)]
        # The cluster's env is the caller's minus Slurm's; the thread setting matches the others.
        proc = cluster.run(argv, env=SLURM_ENV, timeout=TIMEOUT_S)
        assert proc.returncode == 0, (
            f"{argv} exited {proc.returncode}\n{proc.stderr[-6000:]}\n{cluster.diagnostics()}"
        )

    return run


def trainjob(runs: Runs, out: Path) -> None:
    """A TrainJob of 2 nodes x numProcPerNode 2, each pod running `trainbox exec -- ...`."""
    envs = pods.trainjob_pods("own", nodes=2, nproc="2", port=free_port())
    pods.ensure_resolves(pods.trainjob_master("own"))
    started = pods.start_pods(envs, _exec_argv(out), base_env=runs.env, log_dir=out.parent / "pods")
    codes = pods.wait_pods(started, timeout=TIMEOUT_S)
    assert set(codes.values()) == {0}, f"pods exited {codes}\n{pods.logs(started)}"


CASES = [
    Case("mpirun-2", 2, mpirun),
    Case("torchrun-2", 2, torchrun),
    Case("srun-2x2", 4, srun(2)),
    Case("srun-2x1-node-mode", 4, srun(1, procs_per_node=2)),
    Case("trainjob-2x2", 4, trainjob),
]
WORLD_SIZES = sorted({case.world_size for case in CASES})


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The module's results cache; each case runs on first use."""
    return Runs(request, tmp_path_factory.mktemp("own_script"))


def test_the_script_imports_nothing_from_trainbox() -> None:
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    modules = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    modules += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert modules, "found no imports at all: the check would prove nothing"
    assert [name for name in modules if name.split(".")[0] == "trainbox"] == []


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_script_trains_with_the_launchers_world_size(runs: Runs, case: Case) -> None:
    result = runs.result(case)
    assert result["world_size"] == case.world_size


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_launchers_agree_on_the_trained_params(runs: Runs, world_size: int) -> None:
    shas: dict[str, list[str]] = {}
    for case in CASES:
        if case.world_size != world_size:
            continue
        try:
            result = runs.result(case)
        except pytest.skip.Exception:
            continue  # that launcher is not installed here (tiers fails instead in CI)
        shas.setdefault(result["params_sha256"], []).append(case.id)
    assert sum(map(len, shas.values())) >= 2, f"fewer than two launchers ran: {shas}"
    assert len(shas) == 1, f"params_sha256 differs between launchers: {shas}"
