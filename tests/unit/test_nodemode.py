"""Node mode: a lone process per node becomes the agent of `dist.procs_per_node` workers."""

from __future__ import annotations

import pytest

from trainbox.launch import detect, promote

from launchcase import expect, srun_task, topology

# Task 1 of `srun -N2 --ntasks-per-node=1`: one process per node.
ONE_PER_NODE = srun_task(
    procid=1, localid=0, nodeid=1, tasks=2, nodes=2, tasks_per_node="1(x2)", nodelist="n[1-2]"
)
TWO_PER_NODE = srun_task(
    procid=3, localid=1, nodeid=1, tasks=4, nodes=2, tasks_per_node="2(x2)", nodelist="n[1-2]"
)
PORT = detect(ONE_PER_NODE).master_port


@pytest.mark.parametrize(
    ("env", "procs", "gpus", "expected"),
    [
        (ONE_PER_NODE, 2, 0, expect("slurm", 2, 0, 4, 2, 1, 2, "n1", PORT, spawns_workers=True)),
        (
            ONE_PER_NODE,
            "auto",
            4,
            expect("slurm", 4, 0, 8, 4, 1, 2, "n1", PORT, spawns_workers=True),
        ),
        # auto without GPUs keeps one process: a CPU node is not split into workers by default.
        (ONE_PER_NODE, "auto", 0, expect("slurm", 1, 0, 2, 1, 1, 2, "n1", PORT)),
        (ONE_PER_NODE, 1, 8, expect("slurm", 1, 0, 2, 1, 1, 2, "n1", PORT)),
        # Already one process per GPU: nothing to spawn.
        (TWO_PER_NODE, 4, 4, expect("slurm", 3, 1, 4, 2, 1, 2, "n1", PORT)),
        ({}, "auto", 2, expect("single", 0, 0, 2, 2, 0, 1, "127.0.0.1", 0, spawns_workers=True)),
    ],
    ids=["srun-2", "srun-auto-4gpu", "srun-auto-cpu", "one-wanted", "per-gpu-srun", "docker-2gpu"],
)
def test_promote(
    env: dict[str, str], procs: int | str, gpus: int, expected: dict[str, object]
) -> None:
    assert topology(promote(detect(env), procs_per_node=procs, visible_gpus=gpus)) == expected


def test_torchrun_workers_are_never_promoted() -> None:
    worker = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
              "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}  # fmt: skip
    assert not promote(detect(worker), procs_per_node=4, visible_gpus=4).spawns_workers


def test_promotion_is_noted() -> None:
    notes = promote(detect(ONE_PER_NODE), procs_per_node=2, visible_gpus=0).notes
    assert "node mode: this process starts 2 workers per node under torchrun" in notes
