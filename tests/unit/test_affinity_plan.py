"""plan() is pure: node layouts, quotas, Slurm cpusets and overrides in, one CpuPlan per rank out."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainbox.affinity import MODES, CpuFacts, CpuPlan, describe, for_command, plan
from trainbox.affinity.plan import srun_binding, with_workers
from trainbox.errors import UsageError

NODE0 = frozenset(range(48))
NODE1 = frozenset(range(48, 96))
ALL96 = NODE0 | NODE1
# GPUs 0-3 near socket 0, 4-7 near socket 1 (a DGX-like 2-socket node).
GPU8 = [NODE0] * 4 + [NODE1] * 4


def cpus(first: int, last: int) -> frozenset[int]:
    """CPUs first..last inclusive."""
    return frozenset(range(first, last + 1))


def plans(
    facts: Sequence[CpuFacts] | CpuFacts,
    local_world_size: int,
    gpu_cpus: Sequence[frozenset[int] | None] = (),
    **kwargs: object,
) -> list[CpuPlan]:
    """Every local rank's plan; one CpuFacts for all ranks or one per rank."""
    per_rank = facts if isinstance(facts, Sequence) else [facts] * local_world_size
    return [
        plan(
            per_rank[rank],
            local_rank=rank,
            local_world_size=local_world_size,
            gpu_cpus=gpu_cpus,
            **kwargs,  # type: ignore[arg-type]
        )
        for rank in range(local_world_size)
    ]


def assert_disjoint(result: list[CpuPlan]) -> None:
    """No CPU belongs to two ranks."""
    for i, a in enumerate(result):
        for b in result[i + 1 :]:
            assert not a.cpus & b.cpus


# (a) srun --ntasks-per-node=8 -c 6: each task's cpuset is its own 6 CPUs near its GPU.
def srun_task_cpus(rank: int) -> frozenset[int]:
    """The 6 CPUs Slurm gave task `rank`, on its GPU's socket."""
    start = 6 * rank if rank < 4 else 48 + 6 * (rank - 4)
    return cpus(start, start + 5)


@pytest.mark.parametrize(("online", "expected_mode"), [(ALL96, "kept"), (frozenset(), "exclusive")])
def test_srun_per_task_cpusets_are_kept_with_their_own_budget(
    online: frozenset[int], expected_mode: str
) -> None:
    facts = [
        CpuFacts(
            affinity=srun_task_cpus(rank),
            online=online,
            slurm_cpus_per_task=6,
            slurm_tasks_on_node=8,
        )
        for rank in range(8)
    ]
    result = plans(facts, 8, GPU8)
    for rank, p in enumerate(result):
        assert p.mode == expected_mode
        assert p.cpus == srun_task_cpus(rank)
        assert (p.budget, p.num_workers, p.num_threads) == (6, 4, 2)
    assert_disjoint(result)


# (b) a Kubernetes pod with limits.cpu=2.5 on 16 visible CPUs: the quota is the real limit.
@pytest.mark.parametrize(
    ("ranks", "budget", "workers"),
    [(1, 2, 2), (2, 1, 0)],
)
def test_cgroup_quota_is_shared_by_the_local_ranks(ranks: int, budget: int, workers: int) -> None:
    facts = CpuFacts(affinity=cpus(0, 15), online=cpus(0, 15), quota=2.5)
    for p in plans(facts, ranks):
        assert p.mode == "node"
        assert p.cpus == cpus(0, 15)
        assert (p.budget, p.num_workers, p.num_threads) == (budget, workers, 1)
        assert (
            f"cgroup quota 2.5 CPUs shared by {ranks} rank{'s' if ranks > 1 else ''}: {budget} each"
            in p.notes
        )


# (c) srun --cpu-bind=mask_cpu: already bound each task narrowly.
def test_existing_srun_binding_is_kept() -> None:
    facts = CpuFacts(
        affinity=frozenset({2, 3}),
        online=cpus(0, 15),
        slurm_cpu_bind="mask_cpu:",
        slurm_tasks_on_node=4,
    )
    p = plan(facts, local_rank=1, local_world_size=4, gpu_cpus=[cpus(0, 7)] * 4)
    assert p.mode == "kept"
    assert p.cpus == frozenset({2, 3})
    assert p.budget == 2
    assert any("kept srun --cpu-bind binding (mask_cpu:)" in note for note in p.notes)


@pytest.mark.parametrize(
    ("value", "bound"),
    [
        (None, False),
        ("", False),
        ("none", False),
        ("quiet,none", False),
        ("verbose,none", False),
        ("mask_cpu:", True),
        ("quiet,mask_cpu:", True),
        ("cores", True),
        ("map_ldom:", True),
    ],
)
def test_srun_binding_values(value: str | None, bound: bool) -> None:
    assert srun_binding(value) is bound


def test_srun_bind_none_with_full_affinity_is_not_kept() -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96, slurm_cpu_bind="quiet,none")
    assert {p.mode for p in plans(facts, 8, GPU8)} == {"exclusive"}


# (c2) srun with no task plugin to confine its tasks (task/none): every task sees the whole
# node, but Slurm allocated the job only SLURM_CPUS_ON_NODE of them and may give the rest to
# other jobs. The test cluster's `srun -N2 --ntasks-per-node=1` on a 2-CPU machine is this.
@pytest.mark.parametrize(
    ("on_node", "ranks", "tasks", "budget"),
    [(1, 1, 1, 1), (2, 2, 2, 1), (8, 2, 2, 4), (8, 2, 1, 4), (6, 2, 2, 3), (48, 2, 2, 8)],
    ids=["one-cpu-one-task", "two-cpus-two-tasks", "eight-two-tasks", "torchrun-in-one-task",
         "six-two-tasks", "more-than-the-node"],
)  # fmt: skip
def test_an_unconfined_srun_step_keeps_to_the_cpus_slurm_allocated_on_the_node(
    on_node: int, ranks: int, tasks: int, budget: int
) -> None:
    facts = CpuFacts(affinity=cpus(0, 15), online=cpus(0, 15), slurm_cpus_on_node=on_node,
                     slurm_tasks_on_node=tasks)  # fmt: skip
    for p in plans(facts, ranks):
        assert p.budget == budget
        assert p.num_threads + p.num_workers in (budget, budget + 1)
        if budget < 16 // ranks:
            assert any(f"SLURM_CPUS_ON_NODE={on_node}" in note for note in p.notes), p.notes


def test_the_test_clusters_srun_task_plans_as_torchrun_does_on_that_machine() -> None:
    # srun -N2 --ntasks-per-node=1 where each node is the same 2-CPU machine: Slurm allocated
    # one CPU on each, as torchrun --nproc-per-node 2 gives each of its ranks one.
    two = frozenset({0, 1})
    (task,) = plans(CpuFacts(affinity=two, online=two, slurm_cpus_on_node=1,
                             slurm_tasks_on_node=1), 1)  # fmt: skip
    torchrun = plans(CpuFacts(affinity=two, online=two), 2)
    assert {(p.budget, p.num_threads, p.num_workers) for p in (task, *torchrun)} == {(1, 1, 0)}


@pytest.mark.parametrize(
    "facts",
    [
        CpuFacts(affinity=cpus(0, 7), online=cpus(0, 15), slurm_cpus_on_node=2,
                 slurm_tasks_on_node=1),
        CpuFacts(affinity=cpus(0, 15), online=cpus(0, 15), slurm_cpus_on_node=2,
                 slurm_tasks_on_node=1, slurm_cpu_bind="mask_cpu:"),
    ],
    ids=["cpuset", "srun-binding"],
)  # fmt: skip
def test_a_step_whose_cpus_are_confined_takes_them_as_they_are(facts: CpuFacts) -> None:
    # A cgroup cpuset or srun's binding already is the allocation; SLURM_CPUS_ON_NODE may count
    # cores where the set holds their hyperthreads, so it does not cut the set further.
    (p,) = plans(facts, 1)
    assert p.budget == len(facts.affinity)


# (d) a container limited to one CPU, by cpuset or by quota.
@pytest.mark.parametrize(
    ("facts", "mode"),
    [
        (CpuFacts(affinity=frozenset({5}), online=cpus(0, 7)), "kept"),
        (CpuFacts(affinity=cpus(0, 7), online=cpus(0, 7), quota=1.0), "node"),
        (CpuFacts(affinity=cpus(0, 7), online=cpus(0, 7), quota=0.5), "node"),
        (CpuFacts(affinity=frozenset({0}), online=frozenset({0})), "exclusive"),
    ],
)
def test_one_cpu_container(facts: CpuFacts, mode: str) -> None:
    p = plan(facts, local_rank=0, local_world_size=1, gpu_cpus=[])
    assert p.mode == mode
    assert (p.budget, p.num_workers, p.num_threads) == (1, 0, 1)


# (e) torchrun --nproc-per-node=8 on a healthy 2-socket, 96-CPU node.
def test_torchrun_on_two_sockets_gets_disjoint_slices_near_each_gpu() -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96)
    result = plans(facts, 8, GPU8)
    assert_disjoint(result)
    for rank, p in enumerate(result):
        assert p.mode == "exclusive"
        assert p.cpus == cpus(12 * rank, 12 * rank + 11)
        assert p.cpus <= GPU8[rank]
        assert (p.budget, p.num_workers, p.num_threads) == (12, 8, 4)


def test_exclusive_slices_keep_hyperthread_siblings_together() -> None:
    # 48 cores, cpu i and i+48 are siblings; socket 0 holds cores 0-23.
    cores = tuple(frozenset({i, i + 48}) for i in range(48))
    node0 = cpus(0, 23) | cpus(48, 71)
    node1 = cpus(24, 47) | cpus(72, 95)
    facts = CpuFacts(affinity=ALL96, online=ALL96, cores=cores)
    result = plans(facts, 8, [node0] * 4 + [node1] * 4)
    assert_disjoint(result)
    assert result[0].cpus == cpus(0, 5) | cpus(48, 53)
    assert result[5].cpus == cpus(30, 35) | cpus(78, 83)
    for p in result:
        assert all(core <= p.cpus or not core & p.cpus for core in cores)


def test_leftover_cores_go_to_the_lowest_local_ranks() -> None:
    facts = CpuFacts(affinity=cpus(0, 9), online=cpus(0, 9))
    assert [p.cpus for p in plans(facts, 3)] == [cpus(0, 3), cpus(4, 6), cpus(7, 9)]


# (f) CPU-only node, two local ranks on two CPUs.
def test_cpu_only_node_splits_the_affinity() -> None:
    facts = CpuFacts(affinity=frozenset({0, 1}), online=frozenset({0, 1}))
    result = plans(facts, 2)
    assert [p.cpus for p in result] == [frozenset({0}), frozenset({1})]
    assert [(p.mode, p.budget, p.num_threads, p.num_workers) for p in result] == [
        ("exclusive", 1, 1, 0)
    ] * 2


def test_siblings_are_never_split_so_too_few_cores_fall_back_to_node() -> None:
    pair = frozenset({0, 1})
    facts = CpuFacts(affinity=pair, online=pair, cores=(pair,))
    result = plans(facts, 2)
    assert {p.mode for p in result} == {"node"}
    assert {p.cpus for p in result} == {frozenset({0, 1})}
    assert "no exclusive slices (1 core in 0-1 for 2 local ranks): node mode" in result[0].notes


# (g) explicit values win; the other one is sized from what the budget leaves.
@pytest.mark.parametrize(
    ("overrides", "threads", "workers"),
    [
        ({"num_threads": 16, "num_workers": 2}, 16, 2),
        ({"num_workers": 0}, 12, 0),
        ({"num_threads": 3}, 3, 8),
        ({"num_threads": 11}, 11, 1),
        ({"num_workers": 20}, 1, 20),
    ],
)
def test_explicit_overrides_win(overrides: dict[str, int], threads: int, workers: int) -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96)
    p = plan(facts, local_rank=0, local_world_size=8, gpu_cpus=GPU8, **overrides)
    assert (p.num_threads, p.num_workers) == (threads, workers)
    assert p.budget == 12
    for name, value in overrides.items():
        assert f"{name}={value} set explicitly" in p.notes


def test_explicit_values_over_the_budget_are_noted() -> None:
    facts = CpuFacts(affinity=cpus(0, 3), online=cpus(0, 3))
    p = plan(facts, local_rank=0, local_world_size=1, gpu_cpus=[], num_threads=8, num_workers=4)
    assert "8 threads + 4 workers exceed the budget of 4 CPUs" in p.notes


def test_explicit_mode_exclusive_repartitions_a_container_cpuset() -> None:
    # docker --cpuset-cpus=0-15 on a 96-CPU host, torchrun with 4 ranks: auto keeps it.
    facts = CpuFacts(affinity=cpus(0, 15), online=ALL96)
    assert {(p.mode, p.budget) for p in plans(facts, 4)} == {("kept", 4)}
    result = plans(facts, 4, mode="exclusive")
    assert [p.cpus for p in result] == [cpus(0, 3), cpus(4, 7), cpus(8, 11), cpus(12, 15)]
    assert any("re-pinning within the existing binding" in note for note in result[0].notes)


def test_mode_node_pins_to_the_gpu_near_cpus_and_divides_the_budget() -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96)
    # Six GPUs on socket 0, two on socket 1: socket 0's 48 CPUs serve six ranks.
    gpus = [NODE0] * 6 + [NODE1] * 2
    result = plans(facts, 8, gpus, mode="node")
    assert [p.cpus for p in result] == gpus
    assert [p.budget for p in result] == [8] * 6 + [12] * 2


def test_quota_only_pod_uses_node_mode_near_the_gpu() -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96, quota=16.0)
    result = plans(facts, 8, GPU8)
    assert [p.cpus for p in result] == GPU8
    assert {(p.mode, p.budget) for p in result} == {("node", 2)}


def test_torchrun_inside_one_srun_task_divides_cpus_per_task() -> None:
    facts = CpuFacts(
        affinity=cpus(0, 63), online=ALL96, slurm_cpus_per_task=64, slurm_tasks_on_node=1
    )
    result = plans(facts, 8, GPU8)
    assert {(p.mode, p.budget) for p in result} == {("kept", 8)}


def test_ranks_that_are_srun_tasks_without_a_cpuset_are_capped_per_task() -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96, slurm_cpus_per_task=6, slurm_tasks_on_node=8)
    result = plans(facts, 8, GPU8)
    assert {p.budget for p in result} == {6}
    assert "SLURM_CPUS_PER_TASK=6 per rank: 6 each" in result[0].notes
    assert_disjoint(result)


def test_gpu_near_cpus_known_for_some_ranks_only_fall_back_to_node() -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96)
    result = plans(facts, 2, [NODE0, None])
    assert [(p.mode, p.cpus) for p in result] == [("node", NODE0), ("node", ALL96)]


def test_overlapping_gpu_sets_fall_back_to_node() -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96)
    result = plans(facts, 2, [cpus(0, 59), cpus(40, 95)])
    assert {p.mode for p in result} == {"node"}
    assert "overlap" in result[0].notes[-1]


def test_cpuset_that_excludes_the_gpu_node_uses_the_affinity_and_warns() -> None:
    facts = CpuFacts(affinity=cpus(0, 7), online=cpus(0, 7))
    p = plan(facts, local_rank=0, local_world_size=1, gpu_cpus=[cpus(48, 95)], mode="node")
    assert p.cpus == cpus(0, 7)
    assert "excludes every CPU near this rank's GPU" in p.notes[0]


# (h) off: affinity untouched, threads still sized.
def test_mode_off_leaves_affinity_alone() -> None:
    facts = CpuFacts(affinity=ALL96, online=ALL96)
    result = plans(facts, 8, GPU8, mode="off")
    for p in result:
        assert (p.mode, p.cpus, p.budget) == ("off", ALL96, 12)
        assert "pinning off: affinity left as is" in p.notes


@pytest.mark.parametrize(
    "kwargs", [{"mode": "numa"}, {"num_threads": 0}, {"num_workers": -1}], ids=str
)
def test_bad_user_values_are_usage_errors(kwargs: dict[str, object]) -> None:
    facts = CpuFacts(affinity=cpus(0, 3))
    with pytest.raises(UsageError):
        plan(facts, local_rank=0, local_world_size=1, gpu_cpus=[], **kwargs)  # type: ignore[arg-type]


def test_local_rank_outside_the_node_is_a_bug() -> None:
    with pytest.raises(ValueError, match="local_rank 2"):
        plan(CpuFacts(affinity=cpus(0, 3)), local_rank=2, local_world_size=2, gpu_cpus=[])


def test_describe_is_plain_json_data() -> None:
    facts = CpuFacts(affinity=frozenset({3, 1}))
    p = plan(facts, local_rank=0, local_world_size=1, gpu_cpus=[])
    assert describe(p) == {
        "cpus": [1, 3],
        "num_threads": 1,
        "num_workers": 2,
        "mode": "exclusive",
        "budget": 2,
        "notes": [],
    }


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[CpuFacts, int, list[frozenset[int] | None], str]:
    """A node (online CPUs, SMT, NUMA split), an affinity, a quota, Slurm values, GPUs, mode."""
    n = draw(st.integers(1, 64))
    online = frozenset(range(n))
    affinity = frozenset(draw(st.sets(st.integers(0, n - 1), min_size=1)))
    cores: tuple[frozenset[int], ...] = ()
    if n % 2 == 0 and draw(st.booleans()):
        cores = tuple(frozenset({i, i + n // 2}) for i in range(n // 2))
    ranks = draw(st.integers(1, 8))
    layout = draw(st.sampled_from(["none", "numa", "random"]))
    gpus: list[frozenset[int] | None] = []
    if layout == "numa":
        nodes = draw(st.integers(1, min(4, n)))
        size = n // nodes
        gpus = [
            frozenset(range(k * size, (k + 1) * size))
            for k in draw(st.lists(st.integers(0, nodes - 1), min_size=ranks, max_size=ranks))
        ]
    elif layout == "random":
        gpus = draw(
            st.lists(
                st.none() | st.frozensets(st.integers(0, n - 1)),
                min_size=ranks,
                max_size=ranks,
            )
        )
    facts = CpuFacts(
        affinity=affinity,
        online=draw(st.sampled_from([online, frozenset()])),
        quota=draw(st.none() | st.floats(0.05, 80, allow_nan=False)),
        slurm_cpus_per_task=draw(st.none() | st.integers(1, 64)),
        slurm_tasks_on_node=draw(st.none() | st.integers(1, 8)),
        slurm_cpu_bind=draw(st.sampled_from([None, "none", "mask_cpu:"])),
        slurm_cpus_on_node=draw(st.none() | st.integers(1, 128)),
        cores=cores,
    )
    return facts, ranks, gpus, draw(st.sampled_from(MODES))


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_every_plan_stays_inside_the_affinity(
    scenario: tuple[CpuFacts, int, list[frozenset[int] | None], str],
) -> None:
    facts, ranks, gpus, mode = scenario
    result = plans(facts, ranks, gpus, mode=mode)
    assert len({p.mode for p in result}) == 1, "ranks disagree on the mode"
    for p in result:
        assert p.cpus
        assert p.cpus <= facts.affinity
        assert 1 <= p.budget <= len(p.cpus)
        if facts.quota is not None:
            assert p.budget <= max(1, int(facts.quota))
        assert p.num_threads >= 1
        assert p.num_workers >= 0
        # Only a budget of 2 runs more processes than CPUs: its main process shares one.
        assert p.num_threads + p.num_workers == p.budget + (p.budget == 2 and p.num_workers == 2)
    own_cpusets = ranks > 1 and facts.slurm_tasks_on_node == ranks
    if result[0].mode == "exclusive" and not own_cpusets:
        assert_disjoint(result)


# (h) one worker decodes on one CPU, as the main process itself would, and adds the hand-off.
@pytest.mark.parametrize(
    ("budget", "threads", "workers"),
    [(1, 1, 0), (2, 1, 2), (3, 1, 2), (4, 2, 2), (6, 2, 4), (12, 4, 8)],
)
def test_a_rank_never_gets_a_lone_worker(budget: int, threads: int, workers: int) -> None:
    (p,) = plans(CpuFacts(affinity=cpus(0, budget - 1), online=cpus(0, 15)), 1)
    assert (p.budget, p.num_threads, p.num_workers) == (budget, threads, workers)


def test_an_explicit_thread_count_may_leave_one_worker() -> None:
    (p,) = plans(CpuFacts(affinity=cpus(0, 3), online=cpus(0, 15)), 1, num_threads=3)
    assert (p.num_threads, p.num_workers) == (3, 1)


def test_a_command_behind_exec_gets_the_whole_budget_as_threads() -> None:
    (planned,) = plans(CpuFacts(affinity=cpus(0, 7), online=cpus(0, 7)), 1)
    assert (planned.num_threads, planned.num_workers) == (2, 6)
    handed = for_command(planned, threads_set=False)
    # The workers trainbox would start stay in the plan: exec exports their count.
    assert (handed.num_threads, handed.num_workers, handed.cpus) == (8, 6, planned.cpus)


def test_a_thread_count_the_config_set_stays_behind_exec() -> None:
    (planned,) = plans(CpuFacts(affinity=cpus(0, 7), online=cpus(0, 7)), 1, num_threads=3)
    assert for_command(planned, threads_set=True) == planned


# (i) a dataset that wants no workers gives their CPUs to threads, up to the budget.
@pytest.mark.parametrize(("budget", "threads"), [(1, 1), (2, 2), (3, 3), (8, 8)])
def test_workers_a_dataset_does_not_want_become_threads_within_the_budget(
    budget: int, threads: int
) -> None:
    (p,) = plans(CpuFacts(affinity=cpus(0, budget - 1), online=cpus(0, 15)), 1)
    sized = with_workers(p, 0, reason="in memory", grow_threads=True)
    assert (sized.num_threads, sized.num_workers) == (threads, 0)
