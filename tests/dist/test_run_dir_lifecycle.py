"""run_dir's lifecycle end to end: one run at a time, damaged checkpoints kept, a finished run
left alone, a resume that would change the run refused before anything is written.

Every run is real `trainbox run`; single processes unless the test is about ranks agreeing.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from freeport import free_port
from runs import QUICK, clean_env, summary, train, trainbox_argv

pytestmark = pytest.mark.slow


def snapshot(run_dir: Path) -> dict[str, str]:
    """Every file under run_dir (links by target) and its digest."""
    files = {}
    for path in sorted(run_dir.rglob("*")):
        if path.is_symlink():
            files[str(path.relative_to(run_dir))] = "-> " + os.readlink(path)
        elif path.is_file():
            files[str(path.relative_to(run_dir))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("trainbox: error: ")]
    assert errors, stderr[-3000:]
    return errors[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quick completed single-process run (40 steps, checkpoints every 7)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(run_dir, *QUICK)
    return run_dir


@pytest.fixture
def copy_of(finished: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-a", str(finished), str(run_dir)], check=True)
    return run_dir


# --- one run at a time (issue 19, item 3) ---------------------------------------------------


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A long run in tmp_path/run, already training (it holds the lock)."""
    argv = trainbox_argv(1, "run", f"run_dir={tmp_path / 'run'}", "train.max_steps=1000000")
    proc = subprocess.Popen(
        argv, env=clean_env(PYTHONUNBUFFERED="1"), stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("{") and json.loads(line).get("event") == "training":
            break
    else:
        raise AssertionError(f"the holder never started training (exit {proc.wait()})")
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()


def test_a_second_run_on_a_busy_run_dir_exits_2_naming_the_holder(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    second = train(tmp_path / "run", *QUICK, check=False)
    assert second.returncode == 2, second.stderr[-3000:]
    error = error_line(second.stderr)
    assert "is in use by another run" in error
    assert f"pid {holder.pid}" in error
    assert "host " in error
    assert "started " in error
    assert " HINT: " in error
    # Nothing of the second run landed: config.yaml is still the holder's.
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["train"]["max_steps"] == 1000000
    assert holder.poll() is None


def test_every_rank_of_a_refused_run_exits_2(holder: subprocess.Popen[str], tmp_path: Path) -> None:
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = clean_env(
            RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        )  # fmt: skip
        argv = trainbox_argv(1, "run", f"run_dir={tmp_path / 'run'}", *QUICK)
        ranks.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    outputs = [rank.communicate(timeout=120)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [2, 2], outputs[0][-3000:]
    for stderr in outputs:
        assert f"pid {holder.pid}" in error_line(stderr)


def test_a_killed_holder_does_not_block_the_next_run(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    train(tmp_path / "run", *QUICK)
    assert summary(tmp_path / "run")["steps"] == 40


def test_runs_one_after_the_other_share_a_run_dir(tmp_path: Path) -> None:
    train(tmp_path, *QUICK, "train.max_steps=14")
    train(tmp_path, *QUICK, "train.max_steps=21")
    assert summary(tmp_path)["steps"] == 21


# --- damaged checkpoints (issue 19, item 4) -------------------------------------------------


def _damage_every_checkpoint(run_dir: Path) -> None:
    for path in (run_dir / "checkpoints").glob("step-*.pt"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))


def test_every_checkpoint_damaged_exits_2_and_keeps_the_files(copy_of: Path) -> None:
    _damage_every_checkpoint(copy_of)
    before = snapshot(copy_of)
    proc = train(copy_of, *QUICK, "train.max_steps=60", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    error = error_line(proc.stderr)
    assert "every checkpoint in" in error
    assert "step-00000040.pt" in error
    assert "train.resume=never" in error
    assert snapshot(copy_of) == before


def test_resume_never_starts_fresh_and_keeps_the_damaged_files_aside(copy_of: Path) -> None:
    _damage_every_checkpoint(copy_of)
    damaged = {path.name: path.read_bytes() for path in (copy_of / "checkpoints").glob("step-*.pt")}
    train(copy_of, *QUICK, "train.resume=never", "train.keep_last=1")
    assert summary(copy_of)["steps"] == 40
    aside = copy_of / "checkpoints" / "damaged"
    assert {name: (aside / name).read_bytes() for name in damaged} == damaged
    assert sorted(p.name for p in (copy_of / "checkpoints").glob("step-*.pt")) == [
        "step-00000040.pt"
    ]


def test_a_damaged_newest_checkpoint_is_kept_aside_when_an_older_one_resumes(
    copy_of: Path,
) -> None:
    newest = copy_of / "checkpoints" / "step-00000040.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    train(copy_of, *QUICK, "train.max_steps=49", "train.keep_last=1")
    assert summary(copy_of)["steps"] == 49
    assert (copy_of / "checkpoints" / "damaged" / "step-00000040.pt").stat().st_size == 1000


# --- a finished run (issue 19, item 5) ------------------------------------------------------


@pytest.mark.parametrize("max_steps", [40, 30])
def test_rerunning_a_finished_run_leaves_it_alone(copy_of: Path, max_steps: int) -> None:
    before = snapshot(copy_of)
    proc = train(copy_of, *QUICK, f"train.max_steps={max_steps}")
    assert "already complete" in proc.stderr
    assert snapshot(copy_of) == before
    # The CLI's own line says so too, instead of claiming it trained.
    assert proc.stdout.startswith("already complete at step 40:"), proc.stdout


def test_a_run_killed_after_its_last_checkpoint_gets_its_end_redone_once(copy_of: Path) -> None:
    # Killed between the final checkpoint and summary.json: the rerun finishes the end only.
    (copy_of / "summary.json").unlink()
    train(copy_of, *QUICK)
    result = json.loads((copy_of / "summary.json").read_text(), parse_constant=pytest.fail)
    lines = [json.loads(line) for line in (copy_of / "metrics.jsonl").read_text().splitlines()]
    assert result["steps"] == 40
    assert result["final_loss"] == [line for line in lines if line["kind"] == "train"][-1]["loss"]
    assert result["samples_per_s"] is None
    assert [line["step"] for line in lines if line["kind"] == "val"] == [20, 40]


# --- resume with a changed config (issue 19, item 6) ----------------------------------------

REFUSED = [
    (["optim.lr=0.01"], "optim.lr: 0.003 -> 0.01"),
    (["optim.name=sgd"], "optim.name: 'adamw' -> 'sgd'"),
    (["train.amp=fp16"], "train.amp: 'auto' -> 'fp16'"),
    (["model.args.hidden=32"], "model.args.hidden: (unset) -> 32"),
]


@pytest.mark.parametrize(("args", "diff"), REFUSED)
def test_a_change_that_would_alter_the_run_exits_2_before_writing(
    copy_of: Path, args: list[str], diff: str
) -> None:
    before = snapshot(copy_of)
    proc = train(copy_of, *QUICK, "train.max_steps=60", *args, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    error = error_line(proc.stderr)
    assert diff in error
    assert "train.resume_changes=allow" in error
    assert snapshot(copy_of) == before


def test_max_steps_and_logging_may_change_on_resume(copy_of: Path) -> None:
    train(copy_of, *QUICK, "train.max_steps=50", "train.log_every=10", "train.eval_every=0")
    assert summary(copy_of)["steps"] == 50


def _lrs(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["lr"] for line in lines if line["kind"] == "train"}


def test_an_allowed_new_lr_is_the_one_training_uses(tmp_path: Path) -> None:
    constant = ["optim.schedule=constant", "optim.warmup_steps=0"]
    train(tmp_path / "old", *QUICK, *constant, "train.max_steps=20")
    train(tmp_path / "old", *QUICK, *constant, "train.max_steps=30", "optim.lr=0.01",
          "train.resume_changes=allow")  # fmt: skip
    assert _lrs(tmp_path / "old")[30] == pytest.approx(0.01)


@pytest.mark.parametrize("change", ["optim.name=sgd", "train.amp=fp16"])
def test_an_allowed_optimizer_or_precision_change_trains_on(copy_of: Path, change: str) -> None:
    proc = train(copy_of, *QUICK, "train.max_steps=50", change, "train.resume_changes=allow")
    assert summary(copy_of)["steps"] == 50
    assert "resuming with a changed config" in proc.stderr


def _package(root: Path, hidden: int) -> Path:
    (root / "mynet.py").write_text(
        "import torch\n"
        "def model():\n"
        f"    return torch.nn.Sequential(torch.nn.Linear(2, {hidden}), torch.nn.ReLU(),"
        f" torch.nn.Linear({hidden}, 5))\n"
    )
    return root


def test_a_checkpoint_that_does_not_fit_the_model_exits_2_naming_the_parameter(
    tmp_path: Path,
) -> None:
    run_dir, code = tmp_path / "run", tmp_path / "code"
    code.mkdir()
    args = [*QUICK, "model.factory=mynet:model"]
    train(run_dir, *args, "train.max_steps=14", pythonpath=_package(code, 16))
    before = snapshot(run_dir)
    proc = train(run_dir, *args, "train.max_steps=21", check=False, pythonpath=_package(code, 32))
    assert proc.returncode == 2, proc.stderr[-3000:]
    error = error_line(proc.stderr)
    assert "does not fit the model" in error
    assert "0.weight" in error
    assert "Traceback" not in proc.stderr
    assert snapshot(run_dir) == before


# --- a run that fails before writing (issue 19, item 13) ------------------------------------


def test_a_run_that_fails_before_writing_leaves_no_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "new" / "run"
    proc = train(run_dir, *QUICK, f"train.resume={tmp_path / 'nope.pt'}", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert not (tmp_path / "new").exists()
