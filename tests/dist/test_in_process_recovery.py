"""dist.recovery=in_process for real: node mode with 4 workers, each kept with a warm spare.

One run meets every failure the feature promises to survive, in turn: a worker killed with
SIGKILL, a second worker killed while the group re-forms after the first, a spare that dies while
it waits (its keeper starts another, which later replaces its rank), and a worker frozen with
SIGSTOP (its keeper kills it once it has been stopped for half of dist.timeout_s). It ends with
the params_sha256 of the same job run without failures, and metrics.jsonl records each recovery.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runs import shared_run, summary, train

pytestmark = pytest.mark.slow

# Short steps, evaluation and checkpoints on the way; a short wait for a frozen peer.
CONFIG = [
    "dist.procs_per_node=4", "dist.recovery=in_process", "dist.timeout_s=8",
    "train.max_steps=60", "train.log_every=5", "train.eval_every=20", "train.ckpt_every=7",
    "model.args.hidden=512",
]  # fmt: skip
# In the order they fire. Rank 3 dies as it starts the hand-over after rank 2's loss; rank 1's
# first spare dies as it starts waiting, so its second one replaces rank 1 at step 25.
FAULTS = ";".join([
    "kill:rank=2:step=10", "kill:rank=3:point=handover", "kill:rank=1:point=spare",
    "kill:rank=1:step=25", "signal:rank=0:step=40:sig=STOP",
])  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job without failures (and without spares, which it would never use)."""
    return shared_run(tmp_path_factory, *CONFIG, "dist.max_recoveries=0")


@pytest.fixture(scope="module")
def faulted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The job with FAULTS, each firing once across every process; (run_dir, stderr)."""
    root = tmp_path_factory.mktemp("in-process")
    env = {"TRAINBOX_FAULT": FAULTS, "TRAINBOX_FAULT_ONCE": str(root / "fired")}
    proc = train(root / "run", *CONFIG, env=env)
    return root / "run", proc.stderr


def recoveries(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for line in lines if (record := json.loads(line))["kind"] == "recovery"]


def test_the_run_survives_every_failure_with_the_uninterrupted_parameters(
    reference: Path, faulted: tuple[Path, str]
) -> None:
    run_dir, _ = faulted
    assert summary(run_dir)["params_sha256"] == summary(reference)["params_sha256"]
    assert summary(run_dir)["steps"] == 60


def test_a_killed_worker_is_replaced_by_its_spare(faulted: tuple[Path, str]) -> None:
    run_dir, _ = faulted
    first = recoveries(run_dir)[0]
    assert (first["rank"], first["cause"]) == (2, "SIGKILL")
    assert first["step"] == 11, "training goes on from the step after the last one all kept"
    assert first["node"]


def test_a_worker_killed_during_a_recovery_joins_the_same_recovery(
    faulted: tuple[Path, str],
) -> None:
    run_dir, _ = faulted
    first, second = recoveries(run_dir)[:2]
    assert (second["rank"], second["cause"]) == (3, "SIGKILL")
    # Both were replaced by one re-formed group: the one the first attempt's loss led to.
    assert second["generation"] == first["generation"] >= 2


def test_a_spare_that_dies_while_waiting_is_started_again(faulted: tuple[Path, str]) -> None:
    run_dir, stderr = faulted
    assert "spare ended while waiting: starting another" in stderr
    replaced = [record for record in recoveries(run_dir) if record["rank"] == 1]
    assert [record["cause"] for record in replaced] == ["SIGKILL"]


def test_a_stopped_worker_is_killed_and_replaced(faulted: tuple[Path, str]) -> None:
    run_dir, stderr = faulted
    assert "trainer stopped: killing it" in stderr
    last = recoveries(run_dir)[-1]
    # Rank 0 writes the run's files: its replacement goes on writing them.
    assert (last["rank"], last["cause"]) == (0, "stopped")
    assert (run_dir / "summary.json").exists()


def test_each_recovery_retrains_at_most_one_step(faulted: tuple[Path, str]) -> None:
    run_dir, _ = faulted
    records = recoveries(run_dir)
    assert len(records) == 4
    assert all(0 <= record["steps_retrained"] <= 1 for record in records)
    assert all(record["seconds"] > 0 for record in records)


def test_the_summary_counts_the_replaced_ranks(faulted: tuple[Path, str]) -> None:
    run_dir, _ = faulted
    assert summary(run_dir)["recoveries"] == 4


def test_without_a_failure_nothing_is_recovered(reference: Path) -> None:
    assert summary(reference)["recoveries"] == 0
    assert recoveries(reference) == []
