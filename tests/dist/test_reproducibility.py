"""Same config + seed + world size gives the same params_sha256: rerun, resumed, or killed.

Every run here is real: `torchrun --standalone --nproc-per-node 2 -m trainbox run` with gloo.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runs import QUICK, killed_after_first_checkpoint, shared_run, summary, train

pytestmark = pytest.mark.slow

# Wide enough that a step takes milliseconds, so a kill lands mid-run, not after the end.
CONFIG = [*QUICK, "model.args.hidden=512"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted two-process run that the others must reproduce."""
    return shared_run(tmp_path_factory, *CONFIG, nproc=2)


def test_same_config_seed_and_world_size_give_the_same_parameters(
    reference: Path, tmp_path: Path
) -> None:
    train(tmp_path, *CONFIG, nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    assert summary(tmp_path)["world_size"] == 2


def test_another_seed_gives_other_parameters(reference: Path, tmp_path: Path) -> None:
    train(tmp_path, *CONFIG, "seed=1", nproc=2)
    assert summary(tmp_path)["params_sha256"] != summary(reference)["params_sha256"]


@pytest.mark.parametrize("step", [7, 21])
def test_resuming_from_any_checkpoint_reproduces_the_run(
    reference: Path, tmp_path: Path, step: int
) -> None:
    middle = reference / "checkpoints" / f"step-{step:08d}.pt"
    train(tmp_path, *CONFIG, f"train.resume={middle}", nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    first_logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"]
    assert first_logged > step


def test_a_killed_run_resumes_to_the_same_parameters(reference: Path, tmp_path: Path) -> None:
    killed_after_first_checkpoint(2, tmp_path, *CONFIG)
    train(tmp_path, *CONFIG, nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]


def test_one_process_with_twice_the_batch_equals_two_processes(
    reference: Path, tmp_path: Path
) -> None:
    # The same samples per step, averaged the same way: only float summation order differs.
    batch = 2 * 64
    train(tmp_path, *CONFIG, f"train.batch_size={batch}", nproc=1)
    ours = torch.load(_final_checkpoint(tmp_path), weights_only=True)["model"]
    theirs = torch.load(_final_checkpoint(reference), weights_only=True)["model"]
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-5, msg=name)


def _final_checkpoint(run_dir: Path) -> Path:
    return sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]


def test_gradient_accumulation_matches_the_larger_batch(reference: Path, tmp_path: Path) -> None:
    # Two micro-batches of 32 under no_sync take the same samples as one batch of 64.
    train(tmp_path, *CONFIG, "train.batch_size=32", "train.grad_accum=2", nproc=2)
    ours = torch.load(_final_checkpoint(tmp_path), weights_only=True)["model"]
    theirs = torch.load(_final_checkpoint(reference), weights_only=True)["model"]
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-5, msg=name)


# Dropout draws from torch's global RNG every step, so a resume is exact only if nothing else
# (a DataLoader starting an epoch or an evaluation, say) draws from it between the saved state
# and the steps that follow.
DROPOUT = [*QUICK, "model.factory=trainbox.tasks.mlp:mlp", "model.args.in_features=2",
           "model.args.out_features=5", "model.args.dropout=0.3"]  # fmt: skip


@pytest.fixture(scope="module")
def dropout_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted one-process run of DROPOUT, which every resume of it must reproduce."""
    run_dir = tmp_path_factory.mktemp("dropout") / "whole"
    train(run_dir, *DROPOUT)
    return run_dir


@pytest.mark.parametrize("step", [7, 21])
def test_a_model_with_dropout_resumes_bit_for_bit(
    dropout_run: Path, tmp_path: Path, step: int
) -> None:
    middle = dropout_run / "checkpoints" / f"step-{step:08d}.pt"
    train(tmp_path, *DROPOUT, f"train.resume={middle}")
    assert summary(tmp_path)["params_sha256"] == summary(dropout_run)["params_sha256"]
