"""train.strategy=fsdp under every launcher: Open MPI's mpirun and srun on the local Slurm
cluster train the built-in task at two ranks to torchrun's params_sha256. train.strategy=hsdp
too: srun's two nodes of two ranks each train on a 2 x 2 mesh, its shard size taken from Slurm's
tasks per node, to torchrun's params on the same mesh.

torchrun's runs are tests/dist/test_fsdp.py's and tests/dist/test_hsdp.py's references (the same
config, made once a session).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiers
from launchers.slurm_cluster import SlurmCluster
from runs import QUICK, clean_env, run_record, shared_run, summary

pytestmark = pytest.mark.slow

# tests/dist/test_fsdp.py's config: two micro-batches and clipping, so both run sharded.
CONFIG = [*QUICK, "train.strategy=fsdp", "train.batch_size=48", "train.grad_accum=2",
          "train.clip_grad_norm=0.5"]  # fmt: skip
# tests/dist/test_hsdp.py's config: eight steps, accumulating and clipping (the norm over a 2-D
# mesh). No train.shard_size: 0 takes the ranks per node from the launcher.
HSDP_CONFIG = [*QUICK, "train.eval_every=0", "train.log_every=2", "train.ckpt_every=4",
               "train.grad_accum=2", "train.clip_grad_norm=0.5", "train.max_steps=8",
               "train.strategy=hsdp"]  # fmt: skip
PYTHON = sys.executable
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchrun --standalone --nproc-per-node=2's run."""
    return shared_run(tmp_path_factory, *CONFIG, nproc=2)


@pytest.fixture(scope="module")
def torchrun_hsdp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/dist/test_hsdp.py's reference run: torchrun --standalone --nproc-per-node=4 on the
    2 x 2 mesh given explicitly, as one node of four ranks would otherwise shard over all four."""
    return shared_run(tmp_path_factory, *HSDP_CONFIG, "train.shard_size=2", nproc=4)


def trained(run_dir: Path, launcher: str, *, steps: int = 40, world_size: int = 2) -> str:
    """The run's params_sha256, once its summary says it trained every step at every rank."""
    done = summary(run_dir)
    assert (done["steps"], done["world_size"], done["launcher"]) == (steps, world_size, launcher)
    return str(done["params_sha256"])


def threads(run_dir: Path) -> dict[str, int]:
    """Rank 0's intra-op threads and DataLoader workers, as run.json records them."""
    return dict(run_record(run_dir)["threads"])


def srun_trains(cluster: SlurmCluster, run_dir: Path, *, per_node: int, config: list[str]) -> None:
    """`srun -N2 --ntasks-per-node=PER_NODE trainbox run` on the cluster, which must succeed."""
    argv = ["srun", "-N2", f"--ntasks-per-node={per_node}", PYTHON, "-m", "trainbox", "run",
            f"run_dir={run_dir}", *config]  # fmt: skip
    env = {"OMP_NUM_THREADS": clean_env()["OMP_NUM_THREADS"]}
    proc = cluster.run(argv, env=env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stderr[-6000:]}\n{cluster.diagnostics()}"


def test_mpirun_trains_to_torchruns_params(torchrun: Path, tmp_path: Path) -> None:
    tiers.require_commands("mpirun")
    argv = [*MPIRUN, PYTHON, "-m", "trainbox", "run", f"run_dir={tmp_path}", *CONFIG]
    env = clean_env(PATH=f"{Path(PYTHON).parent}:{os.environ.get('PATH', os.defpath)}")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert trained(tmp_path, "mpi") == trained(torchrun, "torchrun")


def test_srun_on_two_nodes_trains_to_torchruns_params(
    torchrun: Path, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # One task on each of the cluster's two nodes, which are this machine: Slurm allocates each
    # task one CPU, as torchrun gives each of its two ranks one, so both plan one thread. The
    # threads are left to the plan on purpose: on CPU a matrix product split over two threads
    # can add in another order (an AMD EPYC's MKL did), so a plan that differs shows here.
    srun_trains(slurm_cluster, tmp_path, per_node=1, config=CONFIG)
    assert threads(tmp_path) == threads(torchrun)
    assert trained(tmp_path, "slurm") == trained(torchrun, "torchrun")


def test_hsdp_srun_on_two_nodes_of_two_ranks_trains_to_torchruns_params(
    torchrun_hsdp: Path, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # Two tasks on each of the cluster's two nodes, which are this machine: a node advertises two
    # CPUs, so Slurm allocates each task one and every rank plans one thread, as each of
    # torchrun's four ranks sharing a machine of under eight CPUs does; a plan that differs
    # shows here. No train.shard_size: a node's two consecutive ranks form a shard group,
    # replicated across the nodes, the mesh the reference is given, so bit-equal params.
    srun_trains(slurm_cluster, tmp_path, per_node=2, config=HSDP_CONFIG)
    assert run_record(tmp_path)["mesh"] == {"replicate": 2, "shard": 2}
    assert threads(tmp_path) == threads(torchrun_hsdp)
    srun_params = trained(tmp_path, "slurm", steps=8, world_size=4)
    assert srun_params == trained(torchrun_hsdp, "torchrun", steps=8, world_size=4)
