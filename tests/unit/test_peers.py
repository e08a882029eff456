"""Cross-rank consistency: differences are named by rank and host; the table shows everyone."""

from __future__ import annotations

import dataclasses

import pytest

from trainbox.affinity import CpuFacts, plan
from trainbox.distributed.peers import TABLE_RANKS, PeerFacts, differences, local, mismatches, table
from trainbox.process.provenance import Provenance

BASE = PeerFacts(
    rank=0, host="n1", trainbox="0.1.0", torch="2.13.0", cuda="12.8", nccl="2.27.3",
    image_revision="abc123", lock_sha256="5eed", config_hash="f00d", gpu_model="NVIDIA H100", node_cpus=96,
    cpu_budget=12, threads=10,
)  # fmt: skip


def cluster(*changes: dict[str, object]) -> list[PeerFacts]:
    return [
        dataclasses.replace(BASE, rank=rank, host=f"n{rank // 2 + 1}", **change)  # type: ignore[arg-type]
        for rank, change in enumerate(changes)
    ]


def test_identical_ranks_agree() -> None:
    assert mismatches(cluster({}, {}, {}, {})) == []


def test_a_stale_image_is_named_with_its_rank_and_host() -> None:
    (problem,) = mismatches(cluster({}, {}, {}, {"image_revision": "old999"}))
    assert (
        problem == "image_revision differs: 'abc123' on ranks 0-2 (n1, n2); 'old999' on rank 3 (n2)"
    )


def test_an_image_built_from_another_lock_is_named_with_its_rank_and_host() -> None:
    # Same revision label, different packages: a rebuild after `scripts/lock` on one node only.
    (problem,) = mismatches(cluster({}, {}, {}, {"lock_sha256": "01d"}))
    assert problem == "lock_sha256 differs: '5eed' on ranks 0-2 (n1, n2); '01d' on rank 3 (n2)"


def test_a_rank_reports_the_lock_its_image_was_built_from() -> None:
    image = Provenance(lock_sha256="5eed", revision="abc123")
    mine = local(rank=0, config_hash="f00d", gpu_model=None, cpu_budget=1, env={}, image=image)
    assert mine.lock_sha256 == "5eed"


def test_a_stale_node_among_4096_ranks_is_named_on_a_short_line() -> None:
    # 512 nodes of 8 ranks; node n300 runs an old image. Listing 4,088 ranks and 511 hosts
    # would make a 25 kB "line"; ranges and a host count keep it readable.
    ranks = [
        dataclasses.replace(
            BASE, rank=rank, host=f"n{rank // 8}",
            image_revision="old999" if rank // 8 == 300 else BASE.image_revision,
        )
        for rank in range(4096)
    ]  # fmt: skip
    (problem,) = mismatches(ranks)
    assert problem == (
        "image_revision differs: 'abc123' on ranks 0-2399, 2408-4095 (n0, n1, n2 and 508 more"
        " hosts); 'old999' on ranks 2400-2407 (n300)"
    )


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([3], "rank 3"), ([0, 1, 2, 5], "ranks 0-2, 5"), ([1, 3, 4], "ranks 1, 3-4")],
)
def test_rank_sets_read_as_ranges(ranks: list[int], text: str) -> None:
    changed = [dict(config_hash="beef") if r in ranks else {} for r in range(6)]
    (problem,) = mismatches(cluster(*changed))
    assert f"'beef' on {text} (" in problem


def test_every_differing_field_is_reported() -> None:
    problems = mismatches(cluster({}, {"torch": "2.12.0", "config_hash": "beef"}))
    assert [p.split(" ")[0] for p in problems] == ["torch", "config_hash"]


def test_table_has_a_row_per_rank() -> None:
    lines = table(cluster({}, {"cpu_budget": 6, "threads": 4})).splitlines()
    assert lines[0].split()[:3] == ["rank", "host", "trainbox"]
    assert len(lines) == 3
    assert lines[2].split()[-2:] == ["6", "4"]


# One NUMA node of 10 cores / 20 threads (CPU i and i+10 are siblings) with 4 GPUs near it.
NUMA20 = frozenset(range(20))
CORES10 = tuple(frozenset({i, i + 10}) for i in range(10))
TWO_CPUS = frozenset({0, 1})


def node_budgets(facts: CpuFacts, ranks: int, gpus: bool) -> list[int]:
    """The budget the planner gives each local rank of one node."""
    near = [facts.affinity] * ranks if gpus else []
    return [
        plan(facts, local_rank=r, local_world_size=ranks, gpu_cpus=near).budget
        for r in range(ranks)
    ]


# (node's CpuFacts, local ranks, GPUs near the node?) per node, and the budgets they get.
UNEVEN = {
    "10 cores / 20 threads, 4 GPU ranks": (
        [(CpuFacts(affinity=NUMA20, online=NUMA20, cores=CORES10), 4, True)],
        [5, 5, 4, 4],
    ),
    "srun -N2 -n3 on 2-CPU nodes": (
        [
            (CpuFacts(affinity=TWO_CPUS, online=TWO_CPUS, slurm_tasks_on_node=2), 2, False),
            (CpuFacts(affinity=TWO_CPUS, online=TWO_CPUS, slurm_tasks_on_node=1), 1, False),
        ],
        [1, 1, 2],
    ),
}


@pytest.mark.parametrize("layout", sorted(UNEVEN))
def test_unequal_cpu_budgets_of_a_healthy_job_are_no_mismatch(layout: str) -> None:
    nodes, expected = UNEVEN[layout]
    budgets = [
        (host, budget)
        for host, (facts, ranks, gpus) in enumerate(nodes)
        for budget in node_budgets(facts, ranks, gpus)
    ]
    assert [budget for _, budget in budgets] == expected
    peers = [
        dataclasses.replace(BASE, rank=rank, host=f"n{host + 1}", cpu_budget=budget)
        for rank, (host, budget) in enumerate(budgets)
    ]
    assert mismatches(peers) == []


# node_cpus per rank, hosts as in cluster() (ranks 0-1 on n1, 2-3 on n2), and the problems.
NODE_CPUS = {
    "equal everywhere": ((96, 96, 96, 96), []),
    # A heterogeneous allocation (or a node with CPUs offline) is slower, not wrong.
    "nodes of different sizes": ((96, 96, 64, 64), []),
    "one host seen two ways": (
        (96, 96, 64, 32),
        ["node_cpus differs on host n2: 64 on rank 2 (n2); 32 on rank 3 (n2)"],
    ),
}


@pytest.mark.parametrize("case", sorted(NODE_CPUS))
def test_node_cpu_totals_must_agree_within_a_host_only(case: str) -> None:
    counts, problems = NODE_CPUS[case]
    assert mismatches(cluster(*({"node_cpus": n} for n in counts))) == problems


def test_table_shows_the_node_cpus_the_budgets_and_the_threads() -> None:
    header = table(cluster({})).splitlines()[0].split()
    assert header[-3:] == ["node_cpus", "cpu_budget", "threads"]


def test_ranks_that_run_other_thread_counts_still_agree() -> None:
    # A thread count follows the CPUs a launcher grants: an uneven step gives ranks unequal ones.
    assert mismatches(cluster({}, {"threads": 1}, {}, {"cpu_budget": 3, "threads": 3})) == []


def test_a_rank_reports_the_intra_op_threads_torch_runs() -> None:
    import torch

    mine = local(rank=0, config_hash="f00d", gpu_model=None, cpu_budget=1, env={},
                 image=Provenance(lock_sha256=None, revision=None))  # fmt: skip
    assert mine.threads == torch.get_num_threads()


def test_a_large_cluster_table_shows_the_first_ranks_and_counts_the_rest() -> None:
    lines = table(cluster(*[{}] * 4096)).splitlines()  # two ranks per host
    assert len(lines) == 1 + TABLE_RANKS + 1
    assert lines[TABLE_RANKS].split()[:2] == [str(TABLE_RANKS - 1), f"n{TABLE_RANKS // 2}"]
    assert (
        lines[-1]
        == f"… and {4096 - TABLE_RANKS:,} more ranks on {2048 - TABLE_RANKS // 2:,} more hosts"
    )


def test_nodes_with_and_without_usable_rdma_are_named_but_not_refused() -> None:
    rdma, broken = "2 active IB port(s) 200 Gb/s", "2 active IB port(s) 200 Gb/s, unusable by NCCL"
    peers = cluster({"fabric": rdma}, {"fabric": rdma}, {"fabric": broken}, {"fabric": broken})
    assert mismatches(peers) == []
    assert differences(peers) == [
        f"fabric differs: {rdma!r} on ranks 0-1 (n1); {broken!r} on ranks 2-3 (n2)"
    ]


def test_nodes_that_agree_on_their_fabric_raise_no_difference() -> None:
    assert differences(cluster(*[{"fabric": "no active RDMA port"}] * 4)) == []
