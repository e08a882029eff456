"""The suite's own plumbing under pytest-xdist (scripts/test runs `-n 3 --dist loadgroup`):
CI's every-tier check still fails a run, tests/conftest.py groups the tests that must not be
split between workers, tests/lanes.py keeps one worker for the machine-wide group, and a
worker's earlier in-process tests cannot hang a later test's forked DataLoader workers.

Each test runs pytest again in a subprocess, on a few files and with every test deselected or
only collected, so nothing heavy runs twice.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
from collections import OrderedDict, defaultdict
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import tiers

ROOT = Path(__file__).parents[2]
# Skips every test before its fixtures: the run only shows the node ids the workers report,
# where xdist appends each test's group ("...::test_x@system"), and schedules by that.
SKIP_PLUGIN = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    pytest.skip("listing only")
"""


def inner_pytest(
    tmp_path: Path, *args: str, require_all: bool = False
) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("xdist") is None:
        tiers.unavailable("pytest-xdist is not installed (pip install -e '.[test]')")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.pop("TRAINBOX_REQUIRE_ALL", None)
    # The outer run's per-test CPU lines (tests/conftest.py) are about its own tests only.
    env.pop("TRAINBOX_TEST_CPU", None)
    if require_all:
        env["TRAINBOX_REQUIRE_ALL"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--basetemp",
            str(tmp_path / "basetemp"), *args]  # fmt: skip
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    "workers", [[], ["-n", "1", "--dist", "loadgroup"]], ids=["serial", "xdist"]
)
def test_a_tier_that_collects_nothing_fails_a_run_that_requires_all(
    tmp_path: Path, workers: list[str]
) -> None:
    # The whole suite is selected (no paths), but three tiers are left out and every test of
    # the other two deselected: the check must fail the run before anything runs.
    ignored = [f"--ignore=tests/{tier}" for tier in ("unit", "dist", "launchers", "container")]
    proc = inner_pytest(tmp_path, *workers, *ignored, "-k", "no_test_has_this_name",
                        require_all=True)  # fmt: skip
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-3000:] + proc.stderr
    assert "no tests collected from tests/unit, tests/dist" in proc.stdout + proc.stderr


def test_xdist_runs_shared_machine_tests_on_one_worker_and_keeps_module_fixtures_whole(
    tmp_path: Path,
) -> None:
    (tmp_path / "skip_all.py").write_text(SKIP_PLUGIN)
    files = [
        # Requests the Slurm cluster lazily (getfixturevalue) from a module-scoped cache.
        "tests/launchers/test_train_matrix.py",
        "tests/container/test_slurm_scripts.py",
        # A module-scoped fixture with a parameter per example, and one that depends on it.
        "tests/dist/test_example_guarantees.py",
        # Function-scoped fixtures only.
        "tests/dist/test_hang_blame.py",
    ]
    proc = inner_pytest(tmp_path, "-p", "skip_all", "-n", "1", "--dist", "loadgroup", "-v", *files)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    groups: dict[str, dict[str, str]] = defaultdict(dict)
    for line in proc.stdout.splitlines():
        if " SKIPPED " in line:
            nodeid = line.split(" SKIPPED ", 1)[1].strip()
            test, _, group = nodeid.rpartition("@") if "@" in nodeid else (nodeid, "", "-")
            groups[test.split("::")[0]][test] = group
    assert sorted(groups) == sorted(files), proc.stdout[-3000:]
    for tier in files[:2]:
        assert set(groups[tier].values()) == {"system"}, groups[tier]
    assert set(groups["tests/dist/test_hang_blame.py"].values()) == {"-"}
    # One group per example: its reference run, its eval runs and the tests that use them.
    examples: dict[str, set[str]] = defaultdict(set)
    for test, group in groups["tests/dist/test_example_guarantees.py"].items():
        examples[group].add(test.rsplit("[", 1)[1])
    assert "-" not in examples
    assert len(examples) > 1
    assert all(len(names) == 1 for names in examples.values()), examples
    assert len(set().union(*examples.values())) == len(examples), examples


def test_a_distributed_run_that_would_split_the_system_group_is_refused(tmp_path: Path) -> None:
    # --dist load schedules test by test: two workers could each start a Slurm cluster.
    proc = inner_pytest(tmp_path, "-n", "1", "--dist", "load", "-k", "trains_in_the_image",
                        "tests/container/test_slurm_scripts.py")  # fmt: skip
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-3000:] + proc.stderr
    assert "is not in xdist group 'system'" in proc.stdout + proc.stderr


def test_with_three_workers_one_runs_the_system_group_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "skip_all.py").write_text(SKIP_PLUGIN)
    files = ["tests/launchers/test_launch_notes.py", "tests/container/test_image.py",
             "tests/unit/test_hostlist.py", "tests/unit/test_launch_detect.py"]  # fmt: skip
    proc = inner_pytest(tmp_path, "-p", "skip_all", "-n", "3", "--dist", "loadgroup", "-v", *files)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tiers_of: dict[str, set[str]] = defaultdict(set)
    for line in proc.stdout.splitlines():
        if line.startswith("[gw") and " SKIPPED " in line:
            worker, nodeid = line[1:].split("]", 1)[0], line.split(" SKIPPED ", 1)[1]
            tiers_of[worker].add(nodeid.split("/", 2)[1])
    lanes = [worker for worker, tiers in tiers_of.items() if tiers & {"launchers", "container"}]
    assert len(lanes) == 1, tiers_of
    assert tiers_of[lanes[0]] == {"launchers", "container"}, tiers_of
    assert set().union(*(tiers_of[w] for w in tiers_of if w != lanes[0])) == {"unit"}, tiers_of


# (the queue of work units, whether this worker is the lane, whether a lane is alive, its pick)
PICKS = [
    (["tests/unit/a.py", "system", "tests/dist/b.py"], True, True, "system"),
    (["tests/unit/a.py", "system", "tests/dist/b.py"], False, True, "tests/unit/a.py"),
    (["system"], False, True, None),
    (["tests/unit/a.py"], True, True, None),
    # The lane worker crashed: whoever asks takes the group, so no unit waits for ever.
    (["system", "tests/unit/a.py"], False, False, "system"),
    ([], False, True, None),
]


@pytest.mark.parametrize(("queue", "is_lane", "has_lane", "pick"), PICKS)
def test_each_worker_takes_only_the_units_of_its_lane(
    queue: list[str], is_lane: bool, has_lane: bool, pick: str | None
) -> None:
    if importlib.util.find_spec("xdist") is None:
        tiers.unavailable("pytest-xdist is not installed (pip install -e '.[test]')")
    from lanes import eligible_scope

    assert eligible_scope(queue, "system", is_lane=is_lane, has_lane=has_lane) == pick


class FakeNode:
    """What the scheduler sends a worker: the test indices to run, or that no more will come."""

    def __init__(self) -> None:
        self.sent: list[list[int]] = []
        self.shut_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shut_down = True


def test_a_worker_with_nothing_left_to_take_is_told_to_finish_the_test_it_holds() -> None:
    # An xdist worker runs a test only once it knows the next (pytest's `nextitem`), so it holds
    # its last one until it gets more work or is shut down: a lane left with its group's last
    # test and only other units in the queue must be shut down now, not when the queue drains.
    if importlib.util.find_spec("xdist") is None:
        tiers.unavailable("pytest-xdist is not installed (pip install -e '.[test]')")
    from lanes import SystemLaneScheduling

    lane, other = FakeNode(), FakeNode()
    # The scheduler's state as xdist leaves it, without a pytest config to build one from.
    scheduler = object.__new__(SystemLaneScheduling)
    scheduler._group, scheduler._lane = "system", lane
    scheduler.workqueue = OrderedDict({"tests/unit/a.py": {"tests/unit/a.py::t": False}})
    scheduler.assigned_work = {
        lane: {"system": {"tests/launchers/x.py::t1": True, "tests/launchers/x.py::t2": False}},
        other: {},
    }
    scheduler._assign_work_unit(lane)
    assert (lane.shut_down, lane.sent) == (True, [])
    assert list(scheduler.workqueue) == ["tests/unit/a.py"]


class CollectingInWorkers(Dataset[torch.Tensor]):
    """Runs a full garbage collection in the DataLoader worker before each sample."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        gc.collect()
        return torch.tensor(index)


def test_a_forked_worker_leaves_alone_a_process_group_an_earlier_test_dropped() -> None:
    # In-process tests share a pytest worker. A gloo group an earlier one left in a reference
    # cycle is still garbage when a later test forks DataLoader workers; if a worker's collector
    # destroys it, the destructor waits for gloo threads that a fork does not copy, for ever.
    gc.disable()  # keeps the group garbage until the fork, as a busy worker's collector may
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        holder: dict[str, object] = {"group": dist.new_group(backend="gloo")}
        holder["self"] = holder
        dist.destroy_process_group()
        del holder
        loader = DataLoader(CollectingInWorkers(), batch_size=2, num_workers=2, timeout=30)
        batches = [batch.tolist() for batch in loader]
    finally:
        gc.enable()
        gc.collect()  # here, in the process whose gloo threads the group's destructor waits for
    assert batches == [[0, 1], [2, 3]]
