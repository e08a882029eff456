"""`trainbox run` for real under every launcher: each trains, and none changes the result.

Every case trains the built-in task with the quick settings into its own run_dir, once per
module (a results cache), so the per-case tests and the per-world-size comparisons share runs.
"""

from __future__ import annotations

import json
import os
import shlex
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
from runs import QUICK, clean_env, summary

pytestmark = pytest.mark.slow

PYTHON = sys.executable
# Job steps, ranks and pods find `trainbox` and this venv's python first on PATH.
VENV_BIN = Path(PYTHON).parent
TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--standalone"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
# Debian's MPICH installs beside Open MPI under its own names (`mpirun` stays Open MPI).
MPICH = "mpiexec.mpich"
# Slurm cases add this to the cluster's client env; the other launchers get it from clean_env.
SLURM_ENV = {"OMP_NUM_THREADS": clean_env()["OMP_NUM_THREADS"]}
# Generous for a loaded 2-core box; a quick 4-process run takes about 10 s.
TIMEOUT_S = 180


def _train_argv(run_dir: Path, *extra: str) -> list[str]:
    """The image's command: `python -m trainbox run`, quick settings, this case's run_dir."""
    return [PYTHON, *_module_argv(run_dir, *extra)]


def _module_argv(run_dir: Path, *extra: str) -> list[str]:
    """`-m trainbox run ...`, for launchers that start python themselves.

    One intra-op thread everywhere: launchers grant different CPU budgets (a pod gets the whole
    box, a torchrun worker a share), and a GEMM split over two threads may add in another order.
    In one CI run on another processor, PyTorchJob pods (two threads each) ended with another
    fingerprint than torchrun's workers (one thread each) of the same config.
    """
    return ["-m", "trainbox", "run", f"run_dir={run_dir}", *QUICK, "pinning.num_threads=1", *extra]


@dataclass(frozen=True)
class Outcome:
    """What a case left behind: its run_dir, and what the launcher printed on stdout."""

    run_dir: Path
    stdout: str


class Matrix:
    """Runs each case at most once per module and remembers how it went, failures included."""

    def __init__(self, request: pytest.FixtureRequest, base: Path) -> None:
        self.request = request
        self.base = base
        self.env = clean_env(PATH=f"{VENV_BIN}:{os.environ.get('PATH', os.defpath)}")
        self._done: dict[str, Outcome | BaseException] = {}

    def slurm(self) -> SlurmCluster:
        """The session's Slurm cluster, started only when a Slurm case first needs it."""
        cluster: SlurmCluster = self.request.getfixturevalue("slurm_cluster")
        return cluster

    def outcome(self, case: Case) -> Outcome:
        """Run `case` unless it already ran; re-raise its skip or failure on every call."""
        if case.id not in self._done:
            try:
                self._done[case.id] = case.run(self, self.base / case.id)
            # Skips and failures too, so that a broken launcher costs one run, not one per test.
            except (Exception, pytest.skip.Exception, pytest.fail.Exception) as exc:
                self._done[case.id] = exc
        result = self._done[case.id]
        if isinstance(result, BaseException):
            raise result
        return result


Runner = Callable[[Matrix, Path], Outcome]


@dataclass(frozen=True)
class Case:
    """One launcher invocation and what its summary must say."""

    id: str
    world_size: int
    # summary.json's `launcher`, and run.json's `launch.flavor`, as rank 0 saw them.
    launcher: str
    flavor: str
    run: Runner


def _local(argv: list[str], matrix: Matrix, run_dir: Path) -> Outcome:
    proc = subprocess.run(
        argv, env=matrix.env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{proc.stderr[-6000:]}"
    return Outcome(run_dir=run_dir, stdout=proc.stdout)


def torchrun(nproc: int) -> Runner:
    """`torchrun --standalone --nproc-per-node N -m trainbox run`."""

    def run(matrix: Matrix, run_dir: Path) -> Outcome:
        argv = [*TORCHRUN, f"--nproc-per-node={nproc}", *_module_argv(run_dir)]
        return _local(argv, matrix, run_dir)

    return run


def mpirun(np: int) -> Runner:
    """Open MPI's `mpirun -np N python -m trainbox run` on this one node (no MASTER_ADDR)."""

    def run(matrix: Matrix, run_dir: Path) -> Outcome:
        tiers.require_commands("mpirun")
        return _local([*MPIRUN, "-np", str(np), *_train_argv(run_dir)], matrix, run_dir)

    return run


def mpich(np: int) -> Runner:
    """MPICH's Hydra launcher, `mpiexec.mpich -n N python -m trainbox run`, on this node."""

    def run(matrix: Matrix, run_dir: Path) -> Outcome:
        tiers.require_commands(MPICH)
        return _local([MPICH, "-n", str(np), *_train_argv(run_dir)], matrix, run_dir)

    return run


def srun(tasks_per_node: int, *extra: str) -> Runner:
    """`srun -N2 --ntasks-per-node=K python -m trainbox run EXTRA` on the local Slurm cluster."""

    def run(matrix: Matrix, run_dir: Path) -> Outcome:
        cluster = matrix.slurm()
        argv = ["srun", "-N2", f"--ntasks-per-node={tasks_per_node}", *_train_argv(run_dir, *extra)]
        # The cluster's env is the caller's minus Slurm's; the thread setting matches the others.
        proc = cluster.run(argv, env=SLURM_ENV, timeout=TIMEOUT_S)
        assert proc.returncode == 0, (
            f"{argv} exited {proc.returncode}\n{proc.stderr[-6000:]}\n{cluster.diagnostics()}"
        )
        return Outcome(run_dir=run_dir, stdout=proc.stdout)

    return run


def sbatch(matrix: Matrix, run_dir: Path) -> Outcome:
    """A job script whose one srun step starts two ranks on each of two nodes."""
    cluster = matrix.slurm()
    script = run_dir.parent / f"{run_dir.name}.sbatch"
    output = run_dir.parent / f"{run_dir.name}.out"
    script.write_text(
        f"#!/bin/sh\n#SBATCH -N2 --ntasks-per-node=2\nsrun {shlex.join(_train_argv(run_dir))}\n",
        encoding="utf-8",
    )
    job = cluster.sbatch(script, args=[f"--output={output}"], env=SLURM_ENV)
    state = cluster.wait_job(job, timeout=TIMEOUT_S)
    text = output.read_text(encoding="utf-8", errors="replace") if output.exists() else ""
    assert state == "COMPLETED", (
        f"job {job} ended {state}\n{text[-6000:]}\n{cluster.diagnostics(job)}"
    )
    return Outcome(run_dir=run_dir, stdout=text)


def pytorchjob(pod_count: int, nproc: str) -> Runner:
    """PyTorchJob `matrix`: a Master and Workers, every pod running `python -m trainbox run`."""

    def run(matrix: Matrix, run_dir: Path) -> Outcome:
        pods.ensure_resolves(pods.pytorchjob_master("matrix"))
        envs = pods.pytorchjob_pods("matrix", pods=pod_count, nproc=nproc, port=free_port())
        return _run_pods(envs, matrix, run_dir)

    return run


def _run_pods(envs: list[dict[str, str]], matrix: Matrix, run_dir: Path) -> Outcome:
    log_dir = run_dir.parent / f"{run_dir.name}-pods"
    started = pods.start_pods(envs, _train_argv(run_dir), base_env=matrix.env, log_dir=log_dir)
    codes = pods.wait_pods(started, timeout=TIMEOUT_S)
    assert set(codes.values()) == {0}, f"pods exited {codes}\n{pods.logs(started)}"
    return Outcome(run_dir=run_dir, stdout=pods.logs(started))


CASES = [
    Case("torchrun-2", 2, "torchrun", "torchelastic", torchrun(2)),
    Case("torchrun-4", 4, "torchrun", "torchelastic", torchrun(4)),
    Case("mpirun-2", 2, "mpi", "openmpi", mpirun(2)),
    Case("mpirun-4", 4, "mpi", "openmpi", mpirun(4)),
    # MPICH names the same facts with other variables; Open MPI's 4-rank case covers the rest.
    Case("mpich-2", 2, "mpi", "mpich", mpich(2)),
    Case("srun-2x2", 4, "slurm", "srun", srun(2)),
    # Node mode: each srun task is its node's torchrun agent, so the ranks are torchrun workers.
    Case("srun-2x1-node-mode", 4, "torchrun", "torchelastic", srun(1, "dist.procs_per_node=2")),
    Case("sbatch-2x2", 4, "slurm", "srun", sbatch),
    # nprocPerNode left at `auto` on a CPU pod: one process per pod.
    Case("pytorchjob-2-auto", 2, "kubeflow", "pytorchjob", pytorchjob(2, "auto")),
    # A numeric nprocPerNode makes each pod a node agent; its workers are torchrun's. The
    # TrainJob's pods do the same, run from the image (tests/container/test_k8s_pods.py).
    Case("pytorchjob-2x2", 4, "torchrun", "torchelastic", pytorchjob(2, "2")),
]
WORLD_SIZES = sorted({case.world_size for case in CASES})


@pytest.fixture(scope="module")
def matrix(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    """The module's results cache; each case runs on first use."""
    return Matrix(request, tmp_path_factory.mktemp("matrix"))


def _launch(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())["launch"]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_trains_all_steps_under_the_launcher(matrix: Matrix, case: Case) -> None:
    outcome = matrix.outcome(case)
    got = summary(outcome.run_dir)
    assert (
        got["steps"],
        got["world_size"],
        got["launcher"],
        _launch(outcome.run_dir)["flavor"],
    ) == (
        40,
        case.world_size,
        case.launcher,
        case.flavor,
    )


def test_sbatch_output_has_the_rank0_result_line(matrix: Matrix) -> None:
    (case,) = [case for case in CASES if case.id == "sbatch-2x2"]
    outcome = matrix.outcome(case)
    lines = [line for line in outcome.stdout.splitlines() if line.startswith("trained 40 steps:")]
    assert len(lines) == 1, outcome.stdout[-4000:]
    assert lines[0].endswith(f"-> {outcome.run_dir / 'summary.json'}")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_launchers_agree_on_the_trained_params(matrix: Matrix, world_size: int) -> None:
    shas: dict[str, list[str]] = {}
    for case in CASES:
        if case.world_size != world_size:
            continue
        try:
            outcome = matrix.outcome(case)
        except pytest.skip.Exception:
            continue  # that launcher is not installed here (tiers fails instead in CI)
        shas.setdefault(summary(outcome.run_dir)["params_sha256"], []).append(case.id)
    assert sum(map(len, shas.values())) >= 2, f"fewer than two launchers ran: {shas}"
    assert len(shas) == 1, f"params_sha256 differs between launchers: {shas}"
