"""fsdp's model options for real: one two-rank run with train.compile, fp16, activation
checkpointing and parameters kept after forward trains to the end; checkpointing and keeping
the parameters change no bit of an fp32 run; an fp16 overflow on one rank's shard skips the step
on every rank.

Each is torchrun --standalone with gloo; the run is `trainbox run` on the built-in task.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runs import QUICK, clean_env, shared_run, summary, train

pytestmark = pytest.mark.slow

OVERFLOW = Path(__file__).resolve().parents[1] / "scripts" / "fsdp_fp16_overflow.py"
# tests/dist/test_fsdp.py's reference run (accumulation and clipping), shared when both ask.
REFERENCE = [*QUICK, "train.strategy=fsdp", "train.batch_size=48", "train.grad_accum=2",
             "train.clip_grad_norm=0.5"]  # fmt: skip
OPTIONS = ["train.strategy=fsdp", "train.compile=true", "train.amp=fp16",
           "train.activation_checkpointing=true", "train.fsdp_reshard_after_forward=false"]  # fmt: skip


@pytest.fixture(scope="module")
def every_option(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("fsdp-options")
    train(run_dir, *QUICK, *OPTIONS, nproc=2)
    return run_dir


def test_fsdp_trains_with_compile_fp16_checkpointing_and_no_reshard(every_option: Path) -> None:
    done = summary(every_option)
    assert (done["steps"], done["world_size"]) == (40, 2)
    assert math.isfinite(done["final_loss"])
    assert math.isfinite(done["val_metrics"]["val_loss"])


def test_the_fp16_loss_scale_is_checkpointed(every_option: Path) -> None:
    record = every_option / "checkpoints" / "step-00000040.dcp" / "record.pt"
    scaler = torch.load(record, weights_only=True)["scaler"]
    assert scaler["scale"] > 0
    assert scaler["_growth_tracker"] > 0  # steps were taken at that scale


def test_checkpointing_and_keeping_gathered_parameters_change_no_bit(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = shared_run(tmp_path_factory, *REFERENCE, nproc=2)
    train(tmp_path, *REFERENCE, "train.activation_checkpointing=true",
          "train.fsdp_reshard_after_forward=false", nproc=2)  # fmt: skip
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]


def test_an_overflow_on_one_ranks_shard_skips_the_step_on_every_rank(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node=2", str(OVERFLOW), str(tmp_path)]  # fmt: skip
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    # Rank 1's own gradients were finite: it learns of the overflow from rank 0.
    assert [(rank["stepped"], rank["scale"]) for rank in found] == [(False, 2.0**15)] * 2
