"""Node mode's supervisor: the node's exit code from torchrun's and the workers' reports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainbox.process import supervise


@pytest.mark.parametrize(
    ("agent_rc", "reported", "expected"),
    [
        (0, {}, 0),
        # torchrun succeeded after a restart; an earlier failure is history.
        (0, {0: 0, 1: 0}, 0),
        # torchrun says 1 for every failure; the workers say why.
        (1, {0: 143, 1: 143}, 143),
        (1, {0: 4, 1: 143}, 4),
        (1, {0: 4, 1: 2}, 2),
        (1, {0: 3}, 3),
        (1, {0: 1}, 1),
        # A worker killed outright reports nothing; the survivors' verdict stands.
        (1, {0: 4}, 4),
        (1, {}, 1),
        # The agent itself killed by SIGKILL: 128 + 9, as a shell would say.
        (-9, {}, 137),
    ],
)
def test_exit_code(agent_rc: int, reported: dict[int, int], expected: int) -> None:
    assert supervise.exit_code(agent_rc, reported, workers=2) == expected


@pytest.mark.parametrize(
    ("agent_rc", "reported", "expected"),
    [
        # Every worker finished its work; a late signal then ended the agent: the work is done.
        (-10, {0: 0, 1: 0}, 0),
        (1, {2: 0, 3: 0}, 0),
        # One worker's word is missing: nothing says the node's work is done.
        (-10, {0: 0}, 138),
    ],
)
def test_a_node_whose_workers_all_finished_exits_0(
    agent_rc: int, reported: dict[int, int], expected: int
) -> None:
    assert supervise.exit_code(agent_rc, reported, workers=2) == expected


def worker_env(
    directory: Path, rank: int, attempt: int | None = None, world: int | None = None
) -> dict[str, str]:
    env = {supervise.OUTCOME_DIR: str(directory), "RANK": str(rank)}
    if attempt is not None:
        env["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
    if world is not None:
        env["WORLD_SIZE"] = str(world)
    return env


def test_reports_of_the_newest_attempt_count(tmp_path: Path) -> None:
    supervise.record_exit_code(worker_env(tmp_path, 0), 4)
    supervise.record_exit_code(worker_env(tmp_path, 1, attempt=0), 4)
    supervise.record_exit_code(worker_env(tmp_path, 0, attempt=1), 143)
    supervise.record_exit_code(worker_env(tmp_path, 1, attempt=1), 143)
    assert supervise.recorded_exit_codes(tmp_path) == {0: 143, 1: 143}


def test_after_a_node_joins_only_the_larger_worlds_reports_count(tmp_path: Path) -> None:
    # A join re-forms the group without counting a restart. This node's worker was rank 0 of
    # one (stopped by the join: 143), then rank 1 of two, which finished.
    supervise.record_exit_code(worker_env(tmp_path, 0, attempt=0, world=1), 143)
    supervise.record_exit_code(worker_env(tmp_path, 1, attempt=0, world=2), 0)
    assert supervise.recorded_exit_codes(tmp_path) == {1: 0}
    assert supervise.exit_code(-15, supervise.recorded_exit_codes(tmp_path), workers=1) == 0


def test_a_restart_outranks_a_larger_world_before_it(tmp_path: Path) -> None:
    # Two nodes, then one left (a failure: a restart), so the newest round is the smaller world.
    supervise.record_exit_code(worker_env(tmp_path, 1, attempt=0, world=2), 4)
    supervise.record_exit_code(worker_env(tmp_path, 0, attempt=1, world=1), 143)
    assert supervise.recorded_exit_codes(tmp_path) == {0: 143}


def test_without_a_supervisor_nothing_is_written(tmp_path: Path) -> None:
    supervise.record_exit_code({"RANK": "0"}, 143)
    supervise.record_exit_code({supervise.OUTCOME_DIR: str(tmp_path)}, 143)  # no rank: not a worker
    assert list(tmp_path.iterdir()) == []


def test_a_report_cut_short_is_ignored(tmp_path: Path) -> None:
    supervise.record_exit_code(worker_env(tmp_path, 0), 143)
    (tmp_path / "000000-000001-1").write_text("")
    assert supervise.recorded_exit_codes(tmp_path) == {0: 143}


# A supervisor in a process of its own (it sets handlers and becomes a subreaper), running an
# "agent" given as Python source.
SUPERVISOR = """
import os, signal, subprocess, sys
from trainbox.process import supervise
from trainbox.process.exec_plan import ExecPlan

def popen(*args, **kwargs):
    if os.environ.get("SIGNAL_BEFORE_AGENT"):
        os.kill(os.getpid(), signal.SIGTERM)  # lands before the agent exists
    return subprocess.Popen(*args, **kwargs)

target = ExecPlan(argv=(sys.executable, "-c", sys.argv[1]), env=dict(os.environ))
sys.exit(supervise.run(target, deadline_at=None, reap_timeout_s=0.5, popen=popen))
"""
# Waits for SIGTERM (exit 143); without one it would sleep a minute and exit 0.
PATIENT_AGENT = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
time.sleep(60)
"""
# Leaves a child behind that ignores SIGTERM and would sleep ten minutes, then exits 0.
DESERTING_AGENT = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
"""


def supervise_agent(agent: str, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", SUPERVISOR, agent]
    return subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=45, check=False)  # fmt: skip


def test_a_signal_before_the_agent_starts_is_passed_on_to_it() -> None:
    started = time.monotonic()
    result = supervise_agent(PATIENT_AGENT, SIGNAL_BEFORE_AGENT="1")
    # Not killed by it (-15): held, then forwarded, so the agent stopped at once with 143.
    assert result.returncode == 143, result.stderr[-2000:]
    assert time.monotonic() - started < 30


def test_workers_left_behind_are_stopped_after_the_reap_timeout() -> None:
    started = time.monotonic()
    result = supervise_agent(DESERTING_AGENT)
    # The orphan ignores TERM: it is killed, and the supervisor exits instead of waiting 600 s.
    assert result.returncode == 0, result.stderr[-2000:]
    assert time.monotonic() - started < 30
    assert (
        "workers outlived the agent" in result.stdout + result.stderr
    )  # structlog unconfigured: stdout
