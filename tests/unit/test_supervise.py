"""Node mode's supervisor: the node's exit code from torchrun's and the workers' reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox import supervise


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
    assert supervise.exit_code(agent_rc, reported) == expected


def worker_env(directory: Path, rank: int, attempt: int | None = None) -> dict[str, str]:
    env = {supervise.OUTCOME_DIR: str(directory), "RANK": str(rank)}
    if attempt is not None:
        env["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
    return env


def test_reports_of_the_newest_attempt_count(tmp_path: Path) -> None:
    supervise.report(worker_env(tmp_path, 0), 4)
    supervise.report(worker_env(tmp_path, 1, attempt=0), 4)
    supervise.report(worker_env(tmp_path, 0, attempt=1), 143)
    supervise.report(worker_env(tmp_path, 1, attempt=1), 143)
    assert supervise.reported(tmp_path) == {0: 143, 1: 143}


def test_without_a_supervisor_nothing_is_written(tmp_path: Path) -> None:
    supervise.report({"RANK": "0"}, 143)
    supervise.report({supervise.OUTCOME_DIR: str(tmp_path)}, 143)  # no rank: not a worker
    assert list(tmp_path.iterdir()) == []


def test_a_report_cut_short_is_ignored(tmp_path: Path) -> None:
    supervise.report(worker_env(tmp_path, 0), 143)
    (tmp_path / "000000-1").write_text("")
    assert supervise.reported(tmp_path) == {0: 143}
