"""Your training, not a demo (issue 14): user code at every named seam, in real `trainbox run`s.

A user package (tests/dist/byo_user.py, copied onto PYTHONPATH) feeds dict batches through its
own step, optimizer with param groups, one-cycle schedule and EMA; resuming reproduces the
uninterrupted run bit for bit, EMA included; init_from starts a new run from its weights; bad
user code and a NaN loss end with exit 2 and one line naming the culprit.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runs import clean_env, summary, train

pytestmark = pytest.mark.slow

USER = "byo_user"
SEAMS = [
    f"model.factory={USER}:wrapped",
    f"data.factory={USER}:records",
    f"train.step={USER}:step",
    f"optim.factory={USER}:groups",
    "optim.args.lr=0.05",
    "optim.args.head_lr=0.1",
    f"optim.schedule_factory={USER}:one_cycle",
    "optim.schedule_args.peak=0.2",
    f"train.state_factory={USER}:ema",
]
STEPS = ["train.max_steps=24", "train.log_every=4", "train.ckpt_every=8", "train.eval_every=0",
         "train.batch_size=16", "train.keep_last=10"]  # fmt: skip


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pkg")
    shutil.copy(Path(__file__).with_name("byo_user.py"), root / f"{USER}.py")
    return root


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, package: Path) -> Path:
    """One uninterrupted two-process run with every seam filled by the user's code."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(run_dir, *STEPS, *SEAMS, nproc=2, pythonpath=package)
    return run_dir


def final(run_dir: Path) -> dict[str, object]:
    return torch.load(run_dir / "checkpoints" / "step-00000024.pt", weights_only=True)


def test_dict_batches_and_a_custom_step_log_its_extras(reference: Path) -> None:
    lines = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    train_lines = [line for line in lines if line["kind"] == "train"]
    assert [line["step"] for line in train_lines] == [4, 8, 12, 16, 20, 24]
    # Averaged over steps and both ranks: a constant stays itself, an accuracy stays a share.
    assert all(line["constant"] == 2.0 for line in train_lines)
    assert all(0.0 <= line["train_accuracy"] <= 1.0 for line in train_lines)
    assert all(math.isfinite(line["loss"]) for line in train_lines)
    used = json.loads((reference / "run.json").read_text())["user_code"]
    assert used == {
        "train.step": f"{USER}:step",
        "optim.factory": f"{USER}:groups",
        "optim.schedule_factory": f"{USER}:one_cycle",
        "train.state_factory": f"{USER}:ema",
    }


def test_param_groups_schedule_and_ema_resume_bit_exactly(
    reference: Path, package: Path, tmp_path: Path
) -> None:
    middle = reference / "checkpoints" / "step-00000008.pt"
    train(tmp_path, *STEPS, *SEAMS, f"train.resume={middle}", nproc=2, pythonpath=package)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    ours, theirs = final(tmp_path), final(reference)
    assert len(ours["optimizer"]["param_groups"]) == 2
    assert ours["scheduler"] == theirs["scheduler"]
    assert ours["extra_state"]["ema"]["updates"] == 24
    for key, value in theirs["extra_state"]["ema"]["shadow"].items():
        assert torch.equal(ours["extra_state"]["ema"]["shadow"][key], value), key


def test_init_from_takes_the_prefixed_weights(
    reference: Path, package: Path, tmp_path: Path
) -> None:
    # lr 0: the weights stay what init_from loaded, so the final checkpoint shows them.
    args = [f"model.factory={USER}:plain", f"data.factory={USER}:records", f"train.step={USER}:step",
            f"train.init_from={reference}", "train.init_prefix=net", "optim.lr=0", "optim.warmup_steps=0"]  # fmt: skip
    train(tmp_path, *STEPS, *args, pythonpath=package)
    loaded = final(tmp_path)["model"]
    source = final(reference)["model"]
    assert loaded.keys() == {key.removeprefix("net.") for key in source}
    for key, value in loaded.items():
        assert torch.equal(value, source[f"net.{key}"]), key
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["initialised_from"] == str(reference / "checkpoints" / "step-00000024.pt")
    assert final(tmp_path)["step"] == 24  # a new run: it counted its own steps from 0


# The same seams as Trainer keywords: a script passes its own functions, no config keys.
SCRIPT = """
import sys, trainbox, byo_user
config = trainbox.load_config(None, sys.argv[1:])
with trainbox.init_distributed(timeout_s=config.dist.timeout_s, seed=config.seed) as session:
    model, (train, val) = byo_user.wrapped(), byo_user.records()
    trainbox.Trainer(config, session, model=model, data=trainbox.Datasets(train=train, val=val),
                     step=byo_user.step, optim_factory=byo_user.groups,
                     schedule_factory=byo_user.one_cycle, state_factory=byo_user.ema).fit()
"""


def test_trainer_keywords_are_the_same_seams_as_the_config_keys(
    package: Path, tmp_path: Path
) -> None:
    args = [
        *STEPS,
        *(arg for arg in SEAMS if arg.startswith(("optim.args", "optim.schedule_args"))),
    ]
    script = [sys.executable, "-c", SCRIPT, f"run_dir={tmp_path / 'api'}", *args]
    proc = subprocess.run(script, env=clean_env(PYTHONPATH=str(package)), capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    train(tmp_path / "run", *STEPS, *SEAMS, pythonpath=package)
    assert summary(tmp_path / "api")["params_sha256"] == summary(tmp_path / "run")["params_sha256"]
    used = json.loads((tmp_path / "api" / "run.json").read_text())["user_code"]
    assert used["train.step"] == f"{USER}:step"
    assert used["train.state_factory"] == f"{USER}:ema"


BAD = [
    ([f"model.factory={USER}:plain", "model.args.width=8", "train.init_prefix=net"],
     "does not fit the model; shapes differ: body.0.weight (16, 4) vs the model's (8, 4)"),
    ([f"model.factory={USER}:plain", "train.init_prefix=nothing"],
     "missing from the checkpoint: body.0.weight"),
    ([f"train.step={USER}:vector_step"], f"train.step {USER}:vector_step returned a tensor of shape (8,)"),
    ([f"optim.factory={USER}:not_an_optimizer"],
     f"optim.factory {USER}:not_an_optimizer returned str 'adam', not a torch.optim.Optimizer"),
    ([f"optim.schedule_factory={USER}:not_a_schedule"],
     f"optim.schedule_factory {USER}:not_a_schedule returned NoneType None, not an LRScheduler"),
    ([f"train.state_factory={USER}:not_a_dict"],
     f"train.state_factory {USER}:not_a_dict returned a list of 1, not a dict"),
    ([f"optim.factory={USER}:groups"], f"optim.factory {USER}:groups does not accept these arguments"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_user_code_is_one_exit_2_line(
    reference: Path, package: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    base = [f"model.factory={USER}:wrapped", f"data.factory={USER}:records", f"train.step={USER}:step",
            f"train.init_from={reference}"]  # fmt: skip
    proc = train(tmp_path, *STEPS, *base, *args, check=False, pythonpath=package)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert line.startswith("trainbox: error: ")
    assert message in line
    assert " HINT: " in line


def test_a_resume_whose_optimizer_state_does_not_fit_is_exit_2(
    reference: Path, package: Path, tmp_path: Path
) -> None:
    middle = reference / "checkpoints" / "step-00000008.pt"
    args = [arg for arg in SEAMS if not arg.startswith("optim.args")]
    # Another optimizer factory needs consent (resume_policy); given, the state must still fit.
    proc = train(tmp_path, *STEPS, *args, f"optim.factory={USER}:one_group", f"train.resume={middle}",
                 "train.resume_changes=allow", check=False, pythonpath=package)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "the optimizer state in" in proc.stderr
    assert " HINT: " in proc.stderr


def test_a_tensor_learning_rate_is_logged_as_a_number(package: Path, tmp_path: Path) -> None:
    args = [f"model.factory={USER}:plain", f"data.factory={USER}:records", f"train.step={USER}:step",
            f"optim.factory={USER}:tensor_lr"]  # fmt: skip
    train(tmp_path, *STEPS, *args, pythonpath=package)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = [record["lr"] for record in records if record["kind"] == "train"]
    assert len(lrs) == 6
    assert all(isinstance(lr, float) for lr in lrs)


def test_a_nan_loss_stops_every_rank_and_keeps_the_last_good_checkpoint(
    package: Path, tmp_path: Path
) -> None:
    args = [f"model.factory={USER}:plain", f"data.factory={USER}:records", f"train.step={USER}:nan_later",
            "train.ckpt_every=4", "train.log_every=6"]  # fmt: skip
    # Node mode: one process supervises both workers and exits with their code, not torchrun's 1.
    proc = train(tmp_path, *STEPS, *args, "dist.procs_per_node=2", check=False, pythonpath=package)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "the training loss became NaN or Inf between steps" in proc.stderr
    assert not (tmp_path / "summary.json").exists()
    kept = sorted((tmp_path / "checkpoints").glob("step-*.pt"))
    assert kept, proc.stderr[-3000:]
    for path in kept:
        weights = torch.load(path, weights_only=True)["model"]
        assert all(torch.isfinite(value).all() for value in weights.values()), path


def test_ranks_returning_other_extra_names_stop_together(package: Path, tmp_path: Path) -> None:
    args = [
        f"model.factory={USER}:plain",
        f"data.factory={USER}:records",
        f"train.step={USER}:rank_named",
    ]
    proc = train(tmp_path, *STEPS, *args, "dist.procs_per_node=2", check=False, pythonpath=package)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        f"train.step {USER}:rank_named returned other extra scalar names on other ranks by step 4"
        in proc.stderr
    )
