"""A shipped user package under Open MPI and a real Slurm step: `trainbox run` with the
example's own config gives one params_sha256 under both, world size 2. (Under torchrun the
examples are proved in tests/dist/test_example_guarantees.py, and test_train_matrix.py shows
every launcher agreeing on the built-in task; a torchrun twin here cost 40 s of CI and added
no launcher.)

The examples and their CI overrides come from the table in tests/dist/test_example_guarantees.py
(one thread per rank is among its overrides: thread counts can change CPU numerics).

A rank that fails or hangs must come back as its own error line, well inside the test's timeout:
srun gets --kill-on-bad-exit=1 (as slurm/*.sbatch do), so a rank that exits early ends the step
instead of leaving its peer in the rendezvous for dist.timeout_s; dist.timeout_s is below the
timeout, so a real hang ends in trainbox's exit 4 naming the stuck rank; and a step that outlives
the timeout all the same fails with what the ranks printed, not a bare TimeoutExpired.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dist.test_example_guarantees import EXAMPLES, Example, argv

import tiers
from launchers.slurm_cluster import SlurmCluster
from runs import clean_env, summary

pytestmark = pytest.mark.slow

# Ranks and job steps find `trainbox` and this venv's python first on PATH.
VENV_BIN = Path(sys.executable).parent
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH"]


# One task per fake node; a task that exits non-zero ends the whole step.
SRUN = ["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
TIMEOUT_S = 300
# Below TIMEOUT_S with room for the watchdog's grace: a hung rank ends with exit 4 and a verdict.
DIST_TIMEOUT = "dist.timeout_s=120"
# One example: what a launcher changes for user code is only how its package and config reach
# every rank (PYTHONPATH through `mpirun -x` and srun's environment), the same for each example;
# each example's own guarantees are proved under torchrun. The dict-batch one: its batches and
# metrics take the most user code through the launch. Should a step hang (the masked
# autoencoder's did once in CI, and not again in 68 runs), the rules above name the rank.
LAUNCHED = [example for example in EXAMPLES if example.name == "tabular_dict"]


@pytest.fixture(scope="module", params=LAUNCHED, ids=lambda example: example.name)
def twin(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    slurm_cluster: SlurmCluster,
) -> tuple[Example, str, Path]:
    """The example, the fingerprint of its run under srun (2 nodes, 1 task each), its run_dir."""
    example: Example = request.param
    run_dir = tmp_path_factory.mktemp(f"{example.name}-srun")
    proc = srun(slurm_cluster, example, "trainbox", "run", f"run_dir={run_dir}", *argv(example),
                DIST_TIMEOUT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:] + slurm_cluster.diagnostics()
    return example, str(summary(run_dir)["params_sha256"]), run_dir


def test_under_mpirun(twin: tuple[Example, str, Path], tmp_path: Path) -> None:
    tiers.require_commands("mpirun")
    example, sha, _ = twin
    path = f"{VENV_BIN}:{os.environ.get('PATH', os.defpath)}"
    env = clean_env(PATH=path, PYTHONPATH=str(example.pythonpath))
    command = [*MPIRUN, "trainbox", "run", f"run_dir={tmp_path}", *argv(example), DIST_TIMEOUT]
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (summary(tmp_path)["launcher"], summary(tmp_path)["world_size"]) == ("mpi", 2)
    assert summary(tmp_path)["params_sha256"] == sha


def test_eval_at_3_ranks_under_mpirun_gives_the_trainings_own_metrics(
    twin: tuple[Example, str, Path], tmp_path: Path
) -> None:
    """Float metrics to the last bit: trained at 2 ranks under srun, evaluated at 3 under
    Open MPI, each validation batch holds the same samples and the batches add in order."""
    tiers.require_commands("mpirun")
    example, _, run_dir = twin
    path = f"{VENV_BIN}:{os.environ.get('PATH', os.defpath)}"
    env = clean_env(PATH=path, PYTHONPATH=str(example.pythonpath))
    output = tmp_path / "eval.json"
    mpirun = [*MPIRUN[:3], "-np", "3", *MPIRUN[5:]]
    command = [*mpirun, "trainbox", "eval", "--checkpoint", str(run_dir), "--output", str(output)]
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(output.read_text())
    assert result["world_size"] == 3
    assert result["val_metrics"] == summary(run_dir)["val_metrics"]


def srun(
    cluster: SlurmCluster, example: Example, *task: str, timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """`srun -N2 TASK` with the example importable; a step past `timeout` fails the test with
    the tail of what its ranks printed and the cluster's state."""
    env = {"PYTHONPATH": str(example.pythonpath), "OMP_NUM_THREADS": "1"}
    try:
        return cluster.run([*SRUN, *task], env=env, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        printed = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part or ""
            for part in (err.stdout, err.stderr)
        )
        pytest.fail(
            f"srun step still running after {timeout:g} s; its ranks printed:\n"
            + printed[-6000:]
            + cluster.diagnostics()
        )


def test_under_srun(twin: tuple[Example, str, Path]) -> None:
    _, _, run_dir = twin
    assert (summary(run_dir)["launcher"], summary(run_dir)["world_size"]) == ("slurm", 2)


def test_a_rank_that_fails_alone_under_srun_ends_the_step_with_its_error(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Rank 0 exits before the rendezvous: rank 1, waiting there for it, is stopped at once.

    Without --kill-on-bad-exit rank 1 would wait dist.timeout_s (600 s by default), and the
    test's timeout would throw rank 0's error line away. srun names the failed task and its exit
    code itself; what the task printed is read from its own --error file, written on its node by
    slurmstepd: when srun kills a step it aborts its own I/O forwarding, and in 2 of 15 runs a
    line the task wrote just before exiting never reached srun's stderr.
    """
    example = EXAMPLES[0]
    run = f'exec trainbox run "run_dir={tmp_path}" "$@"'
    task = f'if [ "$SLURM_PROCID" = 0 ]; then echo "rank 0 gives up" >&2; exit 3; fi; {run}'
    name = f"fails-alone-{tmp_path.name}"
    files = [f"--job-name={name}", f"--error={tmp_path}/task-%t.err"]
    proc = srun(slurm_cluster, example, *files, "bash", "-c", task, "bash", *argv(example),
                timeout=120)  # fmt: skip
    assert proc.returncode != 0
    assert "task 0: Exited with exit code 3" in proc.stderr
    # The job leaves the queue once every node's slurmstepd has written its task's last words.
    slurm_cluster.wait_gone(name)
    assert "rank 0 gives up" in (tmp_path / "task-0.err").read_text()
