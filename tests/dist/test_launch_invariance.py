"""Where a rank runs does not change what it computes: its node, its place in the node, its CPU
set and its DataLoader workers may differ between launchers, its params_sha256 may not.

Every run is real torchrun with gloo, at two ranks, on any machine. The intra-op thread count is
held at one: it is the one part of a rank's CPU plan that the math depends on (a matrix product
split over two threads may add in another order; docs/training.md, Reproducibility), and each
launcher sizes it from the CPUs it grants. The launcher tests check that launchers granting the
same CPUs plan the same count.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from freeport import free_port
from runs import QUICK, clean_env, shared_run, summary, trainbox_argv

pytestmark = pytest.mark.slow

CONFIG = [*QUICK, "pinning.num_threads=1"]
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchrun --standalone --nproc-per-node 2: two ranks on one node, one CPU each."""
    return shared_run(tmp_path_factory, *CONFIG, nproc=2)


def launch(run_dir: Path) -> dict[str, object]:
    """run.json's launch record and rank 0's threads, with the run's params_sha256."""
    record = json.loads((run_dir / "run.json").read_text())
    done = summary(run_dir)
    assert (done["steps"], done["world_size"]) == (40, 2)
    return {**record["launch"], **record["threads"], "params": done["params_sha256"]}


def test_two_ranks_as_two_nodes_train_to_two_ranks_as_one_node(
    one_node: Path, tmp_path: Path
) -> None:
    # Two torchrun agents that meet through c10d rendezvous: each is a node with one rank, a
    # node rank of its own, and this machine's whole CPU set.
    endpoint = f"127.0.0.1:{free_port()}"
    agent = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
             f"--rdzv-endpoint={endpoint}", "--rdzv-id=invariance"]  # fmt: skip
    argv = trainbox_argv(1, "run", f"run_dir={tmp_path}", *CONFIG)
    torchrun = [argv[0], "-m", "torch.distributed.run", *agent, *argv[1:]]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    agents = [subprocess.Popen(torchrun, env=clean_env(), **quiet) for _ in range(2)]
    errors = [agent.communicate(timeout=TIMEOUT_S)[1] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], errors[0][-4000:] + errors[1][-4000:]
    two, one = launch(tmp_path), launch(one_node)
    assert (two["num_nodes"], two["local_world_size"]) == (2, 1)
    assert (one["num_nodes"], one["local_world_size"]) == (1, 2)
    assert two["params"] == one["params"]


def test_two_ranks_sharing_one_cpu_with_a_worker_each_train_to_the_same_params(
    one_node: Path, tmp_path: Path
) -> None:
    # Both ranks on CPU 0 (a kept binding, as taskset or a cpuset gives) and each with a
    # DataLoader worker, where the reference gives each rank a CPU of its own and no worker.
    argv = trainbox_argv(2, "run", f"run_dir={tmp_path}", *CONFIG, "pinning.num_workers=1")
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False,
                          preexec_fn=lambda: os.sched_setaffinity(0, {0}))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    shared, own = launch(tmp_path), launch(one_node)
    assert (shared["dataloader_workers"], own["dataloader_workers"]) == (1, 0)
    assert shared["params"] == own["params"]
