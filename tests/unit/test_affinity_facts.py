"""read() against fake procfs/sysfs/cgroup trees: quotas on ancestors, v1, no quota, cpulists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainbox.affinity import format_cpulist, parse_cpulist, read

SLURM_STEP = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
    "SLURM_CPUS_PER_TASK": "6",
    "SLURM_CPU_BIND_TYPE": "mask_cpu:",
    "SLURM_CPUS_ON_NODE": "48",
}


def write(root: Path, files: dict[str, str]) -> Path:
    """Create `files` (relative path -> text) under root and return root."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def node(root: Path, *, allowed: str = "0-15", online: str = "0-15", **files: str) -> Path:
    """A fake host with a status file, an online list and extra files."""
    return write(
        root,
        {
            "proc/self/status": f"Name:\tpython\nCpus_allowed:\tffff\nCpus_allowed_list:\t{allowed}\n",
            "sys/devices/system/cpu/online": f"{online}\n",
            **{name.replace("__", "/"): text for name, text in files.items()},
        },
    )


def test_cgroup_v2_quota_on_an_ancestor_is_found(tmp_path: Path) -> None:
    root = write(
        node(tmp_path),
        {
            "proc/self/cgroup": "0::/kubepods/burstable/pod1/ctr\n",
            "sys/fs/cgroup/cpu.max": "max 100000\n",
            "sys/fs/cgroup/kubepods/cpu.max": "max 100000\n",
            "sys/fs/cgroup/kubepods/burstable/pod1/cpu.max": "250000 100000\n",
            "sys/fs/cgroup/kubepods/burstable/pod1/ctr/cpu.max": "max 100000\n",
        },
    )
    assert read({}, root=root).quota == 2.5


def test_cgroup_v2_takes_the_tightest_level(tmp_path: Path) -> None:
    root = write(
        node(tmp_path),
        {
            "proc/self/cgroup": "0::/a/b\n",
            "sys/fs/cgroup/a/cpu.max": "150000 100000\n",
            "sys/fs/cgroup/a/b/cpu.max": "400000 100000\n",
        },
    )
    assert read({}, root=root).quota == 1.5


def test_cgroup_v2_path_outside_the_mount_reads_the_mount_root(tmp_path: Path) -> None:
    # No cgroup namespace: /proc/self/cgroup names the host path, the mount is our own cgroup.
    root = write(
        node(tmp_path),
        {
            "proc/self/cgroup": "0::/system.slice/docker-abc.scope\n",
            "sys/fs/cgroup/cpu.max": "200000 100000\n",
        },
    )
    assert read({}, root=root).quota == 2.0


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    root = write(
        node(tmp_path),
        {
            "proc/self/cgroup": "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "350000\n",
            "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        },
    )
    assert read({}, root=root).quota == 3.5


@pytest.mark.parametrize(
    "files",
    [
        {"proc/self/cgroup": "0::/user.slice\n", "sys/fs/cgroup/user.slice/cpu.max": "max 100000"},
        {
            "proc/self/cgroup": "3:cpu:/\n",
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
        },
        {"proc/self/cgroup": "0::/x\n", "sys/fs/cgroup/x/cpu.max": "garbage\n"},
        {},
    ],
    ids=["v2-max", "v1-minus-one", "garbage", "no-cgroup-file"],
)
def test_no_quota(tmp_path: Path, files: dict[str, str]) -> None:
    assert read({}, root=write(node(tmp_path), files)).quota is None


def test_affinity_from_status_and_online_cpus(tmp_path: Path) -> None:
    facts = read({}, root=node(tmp_path, allowed="0-3,8,10-11", online="0-15"))
    assert facts.affinity == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert facts.online == frozenset(range(16))


def test_injected_affinity_wins(tmp_path: Path) -> None:
    facts = read({}, root=node(tmp_path), affinity=[5, 6])
    assert facts.affinity == frozenset({5, 6})


def test_hyperthread_siblings_become_cores(tmp_path: Path) -> None:
    topology = "sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"
    files = {topology.format(cpu): f"{cpu % 2},{cpu % 2 + 2}\n" for cpu in range(4)}
    files[topology.format(4)] = "4\n"
    files["sys/devices/system/cpu/cpufreq/policy0/x"] = ""
    facts = read({}, root=write(node(tmp_path, allowed="0-4", online="0-4"), files))
    assert facts.cores == (frozenset({0, 2}), frozenset({1, 3}), frozenset({4}))


def test_slurm_values_of_an_srun_step(tmp_path: Path) -> None:
    facts = read(SLURM_STEP, root=node(tmp_path))
    assert (
        facts.slurm_cpus_per_task,
        facts.slurm_tasks_on_node,
        facts.slurm_cpu_bind,
        facts.slurm_cpus_on_node,
    ) == (6, 8, "mask_cpu:", 48)


@pytest.mark.parametrize("drop", ["SLURM_JOB_ID", "SLURM_STEP_ID"], ids=["no-job", "batch-shell"])
def test_slurm_values_outside_a_step_are_ignored(tmp_path: Path, drop: str) -> None:
    env = {k: v for k, v in SLURM_STEP.items() if k != drop}
    facts = read(env, root=node(tmp_path))
    assert (
        facts.slurm_cpus_per_task,
        facts.slurm_tasks_on_node,
        facts.slurm_cpu_bind,
        facts.slurm_cpus_on_node,
    ) == (None, None, None, None)


def test_bad_slurm_numbers_are_unknown(tmp_path: Path) -> None:
    env = {**SLURM_STEP, "SLURM_CPUS_PER_TASK": "0", "SLURM_STEP_TASKS_PER_NODE": "x",
           "SLURM_CPUS_ON_NODE": "-2"}  # fmt: skip
    facts = read(env, root=node(tmp_path))
    assert (facts.slurm_cpus_per_task, facts.slurm_tasks_on_node, facts.slurm_cpus_on_node) == (
        None,
        None,
        None,
    )


def test_missing_status_falls_back_to_online(tmp_path: Path) -> None:
    root = write(tmp_path, {"sys/devices/system/cpu/online": "0-7\n"})
    assert read({}, root=root).affinity == frozenset(range(8))


def test_this_machine() -> None:
    facts = read(os.environ)
    assert facts.affinity == frozenset(os.sched_getaffinity(0))
    assert facts.affinity <= facts.online or not facts.online


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}), ("", set()), ("7", {7}), (" 0 , 2-3 ", {0, 2, 3})],
)
def test_parse_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "0-3:2"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="is"):
        parse_cpulist(text)


def test_format_cpulist_round_trips() -> None:
    assert format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert parse_cpulist(format_cpulist({5, 9, 6})) == frozenset({5, 6, 9})
