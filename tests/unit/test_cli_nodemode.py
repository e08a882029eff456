"""Node mode: the workers torchrun starts run the node's own command line, unchanged."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from trainbox import cli
from trainbox.process.exec_plan import ExecPlan

from runs import clean_env

NODE_MODE = "dist.procs_per_node=2"


@pytest.fixture
def handed_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ExecPlan]]:
    """What node mode handed to torchrun, instead of starting it."""
    seen: list[ExecPlan] = []

    def supervise(target: ExecPlan, *, deadline_at: float | None) -> int:
        del deadline_at
        seen.append(target)
        return 0

    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.pt").write_bytes(b"not read in node mode's agent")
    (tmp_path / "train.yaml").write_text("seed: 3\n")
    with (
        mock.patch.dict(os.environ, clean_env(), clear=True),
        mock.patch("trainbox.process.preempt.StopRequests.install", return_value=lambda: None),
        mock.patch("trainbox.process.launching.supervise_workers", supervise),
    ):
        yield seen


@pytest.mark.parametrize(
    "argv",
    [
        ["run", NODE_MODE, "train.max_steps=3", "--debug"],
        ["run", "seed=7", "--config", "train.yaml", NODE_MODE],
        ["eval", NODE_MODE, "--checkpoint", "model.pt", "--output", "out.json", "--force"],
        ["predict", "--checkpoint=model.pt", NODE_MODE, "--output", "p.csv", "--chunk-size", "9"],
        ["predict", "--checkpoint", "model.pt", "--output", "p.jsonl", NODE_MODE, "--split=train"],
    ],
)
def test_workers_run_the_command_line_as_given(handed_off: list[ExecPlan], argv: list[str]) -> None:
    given = [*argv, "preflight.gpus=off", "run_dir=runs/x"]
    assert cli.main(given) == 0
    (target,) = handed_off
    tail = list(target.argv[-len(given) - 3 :])
    assert tail == [sys.executable, "-m", "trainbox", *given]


def test_exec_takes_overrides_before_the_command(handed_off: list[ExecPlan]) -> None:
    assert cli.main(["exec", NODE_MODE, "preflight.gpus=off", "--", "python", "train.py"]) == 0
    (target,) = handed_off
    assert target.workers == 2
    assert list(target.argv[-3:]) == ["--no-python", "python", "train.py"]


def test_exec_without_a_separator_still_reads_leading_overrides(
    handed_off: list[ExecPlan],
) -> None:
    assert cli.main(["exec", NODE_MODE, "python", "train.py"]) == 0
    (target,) = handed_off
    assert (target.workers, list(target.argv[-2:])) == (2, ["python", "train.py"])
