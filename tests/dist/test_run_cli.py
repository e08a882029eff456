"""`trainbox run` end to end: the default task, its output files, and bad input of every kind.

Bad input must exit 2 with one line and a HINT, and leave a previous run's files untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from trainbox.affinity import processor

from runs import QUICK, clean_env, summary, train, trainbox_argv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quick completed two-process run, to inspect and to protect."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(run_dir, *QUICK, nproc=2)
    return run_dir


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`trainbox run` with every default, in one process: its run_dir and its stdout."""
    run_dir = tmp_path_factory.mktemp("default") / "run"
    return run_dir, train(run_dir).stdout


def test_default_run_trains_the_built_in_task(default_run: tuple[Path, str]) -> None:
    run_dir, stdout = default_run
    result = summary(run_dir)
    assert result["val_metrics"]["val_accuracy"] >= 0.95  # the README's documented target
    assert f"val_accuracy={result['val_metrics']['val_accuracy']:.4g}" in stdout


def test_run_json_records_the_threads_and_workers_rank_0_trained_with(
    default_run: tuple[Path, str],
) -> None:
    # The built-in task holds its samples in memory, so the CPUs a worker would have had go to
    # torch's threads: one process on its own gets its whole affinity as threads.
    threads = json.loads((default_run[0] / "run.json").read_text())["threads"]
    assert threads == {"intra_op": len(os.sched_getaffinity(0)), "dataloader_workers": 0}


def test_output_files(finished: Path) -> None:
    assert {p.name for p in finished.iterdir()} >= {
        "config.yaml",
        "run.json",
        "metrics.jsonl",
        "summary.json",
        "checkpoints",
    }
    result = summary(finished)
    assert result["steps"] == 40
    assert (result["world_size"], result["launcher"]) == (2, "torchrun")
    assert {"final_loss", "val_metrics", "samples_per_s", "params_sha256"} <= result.keys()
    manifest = json.loads((finished / "run.json").read_text())
    assert manifest["launch"]["world_size"] == 2
    assert {
        "trainbox",
        "torch",
        "config_hash",
        "seed",
        "image",
        "backend",
        "host",
    } <= manifest.keys()
    assert manifest["host"]["cpus_logical"] >= 1
    assert manifest["host"]["cpu_kind"] == processor.read().kind
    assert yaml.safe_load((finished / "config.yaml").read_text())["train"]["max_steps"] == 40


def test_only_rank_zero_writes_metrics_once_per_step(finished: Path) -> None:
    lines = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    train_steps = [line["step"] for line in lines if line["kind"] == "train"]
    assert train_steps == list(range(5, 41, 5))
    assert [line["step"] for line in lines if line["kind"] == "val"] == [20, 40]
    assert {"loss", "lr", "samples_per_s", "step_time_s", "data_wait_share"} <= lines[0].keys()


def test_keep_last_prunes_checkpoints(tmp_path: Path) -> None:
    train(tmp_path, *QUICK, "train.keep_last=2")
    assert [p.name for p in sorted((tmp_path / "checkpoints").glob("*.pt"))] == [
        "step-00000035.pt",
        "step-00000040.pt",
    ]


def test_resolved_config_reruns_to_the_same_parameters(finished: Path, tmp_path: Path) -> None:
    train(tmp_path, "--config", str(finished / "config.yaml"), nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(finished)["params_sha256"]


def test_a_truncated_newest_checkpoint_resumes_from_the_previous_one(tmp_path: Path) -> None:
    train(tmp_path, *QUICK, "train.max_steps=14")
    newest = tmp_path / "checkpoints" / "step-00000014.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    proc = train(tmp_path, *QUICK, "train.max_steps=14")
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert any(
        e["event"] == "skipping damaged checkpoint" and "step-00000014.pt" in e["checkpoint"]
        for e in events
    )
    assert any(e["event"] == "resumed" and e["step"] == 7 for e in events)
    assert summary(tmp_path)["steps"] == 14
    assert "  ran:           resumed from step 7 (7 more steps), final loss " in proc.stdout


def _snapshot(run_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def _user_package(root: Path) -> Path:
    (root / "bad_pkg").mkdir(parents=True)
    (root / "bad_pkg" / "__init__.py").write_text(
        "import torch\n"
        "from torch.utils.data import TensorDataset\n"
        "def not_a_model():\n    return 'model'\n"
        "def empty():\n    return TensorDataset(torch.zeros(0, 2), torch.zeros(0)), None\n"
    )
    return root


BAD_INPUTS = [
    (["--config", "{tmp}/missing.yaml"], "config file '{tmp}/missing.yaml' cannot be read"),
    (["--config", "{tmp}/broken.yaml"], "is not valid YAML at line 3"),
    (["train.max_steps=many"], "train.max_steps='many' must be an integer"),
    (["train.max_step=5"], "unknown key 'train.max_step' (did you mean 'train.max_steps'?)"),
    (
        ["model.factory=no_such_pkg:model"],
        "model.factory='no_such_pkg:model': importing 'no_such_pkg' failed",
    ),
    (["model.factory=bad_pkg:not_a_model"], "returned str, not a torch.nn.Module"),
    (["data.factory=bad_pkg:empty"], "the train dataset is empty"),
    (
        ["train.batch_size=9000"],
        "train.batch_size=9000 is larger than this rank's shard of 8192 samples",
    ),
    (["model.args.classes=3"], "the model does not fit the data"),
    (["train.resume=never"], "train.resume=never but"),
    (["train.resume={tmp}/nope.pt"], "train.resume='{tmp}/nope.pt'"),
    (["model.args.hidden=32"], "model.args.hidden: (unset) -> 32"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_exits_2_and_loses_nothing(
    finished: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (tmp_path / "broken.yaml").write_text("train:\n  max_steps: [1\n")
    before = _snapshot(run_dir)
    argv = [arg.format(tmp=tmp_path) for arg in args]
    # One process: under torchrun the agent reports any failed worker as exit 1.
    proc = train(run_dir, *QUICK, *argv, check=False, pythonpath=_user_package(tmp_path / "pkg"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error: ")]
    assert errors, proc.stderr[-3000:]
    assert message.format(tmp=tmp_path) in errors[0]
    assert " HINT: " in errors[0]
    assert _snapshot(run_dir) == before


# Such a run_dir used to train, exit 0 and leave everything in ./s3:/my-bucket/run1, which a
# pod loses with it.
@pytest.mark.parametrize(
    ("run_dir", "problem"),
    [
        ("s3:/my-bucket/run1", "is not a well-formed URL"),
        ("hdfs://namenode/run1", "hdfs:// is not a store trainbox can use"),
    ],
)
def test_a_url_trainbox_cannot_use_exits_2_and_makes_no_local_folder(
    tmp_path: Path, run_dir: str, problem: str
) -> None:
    argv = trainbox_argv(1, "run", f"run_dir={run_dir}", *QUICK)
    proc = subprocess.run(argv, env=clean_env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error: ")]
    assert f"run_dir={run_dir!r}" in error
    assert problem in error
    assert " HINT: write s3://BUCKET/PREFIX" in error
    assert list(tmp_path.iterdir()) == []


def test_unwritable_run_dir_exits_2(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    proc = train(tmp_path / "a-file" / "run", *QUICK, check=False)
    assert proc.returncode == 2
    assert "run_dir: run_dir=" in proc.stderr
    assert "is not a directory" in proc.stderr


def test_report_draws_the_finished_run(finished: Path, tmp_path: Path) -> None:
    output = tmp_path / "curves.png"
    proc = subprocess.run(
        trainbox_argv(1, "report", str(finished), "--output", str(output)),
        env=clean_env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(output)
    assert output.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_node_mode_on_one_box_starts_the_workers_itself(tmp_path: Path) -> None:
    # `docker run` on a multi-GPU box is one process that must start one worker per GPU; here
    # two CPU workers stand in for the GPUs (dist.procs_per_node=2; `auto` counts GPUs).
    proc = train(tmp_path, *QUICK, "dist.procs_per_node=2")
    result = summary(tmp_path)
    assert (result["world_size"], result["launcher"], result["steps"]) == (2, "torchrun", 40)
    assert "torch.distributed.run" in proc.stderr


def _probe_package(root: Path) -> Path:
    """A model factory that writes how many objects the collector had frozen when it was called
    to $PROBE_FILE, then returns the built-in model."""
    root.mkdir()
    (root / "frozen_probe.py").write_text(
        "import gc, os\n"
        "from trainbox.tasks.spirals import model as spirals\n"
        "def model(**kwargs):\n"
        "    with open(os.environ['PROBE_FILE'], 'w') as out:\n"
        "        out.write(str(gc.get_freeze_count()))\n"
        "    return spirals(**kwargs)\n"
    )
    return root


# torch's and trainbox's modules leave about 260,000 objects.
FROZEN_AT_START = 100_000


def test_the_program_trains_with_its_start_up_objects_frozen(tmp_path: Path) -> None:
    """What start-up imported lives until the process ends: a full collection in training (and
    a DataLoader worker forked from it) leaves those objects alone."""
    probe = tmp_path / "frozen.txt"
    train(tmp_path / "run", *QUICK, "train.max_steps=2", "model.factory=frozen_probe:model",
          pythonpath=_probe_package(tmp_path / "pkg"), env={"PROBE_FILE": str(probe)})  # fmt: skip
    assert int(probe.read_text()) > FROZEN_AT_START


def test_eval_runs_as_the_summary_prints_it_with_its_start_up_objects_frozen(
    tmp_path: Path,
) -> None:
    """The model comes from a package on PYTHONPATH: the printed command says so itself."""
    package, probe = _probe_package(tmp_path / "pkg"), tmp_path / "frozen.txt"
    run_dir = tmp_path / "run"
    trained = train(run_dir, *QUICK, "train.max_steps=2", "model.factory=frozen_probe:model",
                    pythonpath=package, env={"PROBE_FILE": str(probe)})  # fmt: skip
    probe.unlink()
    proc = _as_printed(trained.stdout, "evaluate", env=clean_env(PROBE_FILE=str(probe)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(probe.read_text()) > FROZEN_AT_START


def _as_printed(stdout: str, name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the summary's `name` command as a shell would: its VAR=value words set the
    environment, and `trainbox` is this Python's."""
    (line,) = [line for line in stdout.splitlines() if line.strip().startswith(f"{name}:")]
    words = shlex.split(line.split(":", 1)[1])
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env = env | {key: value}
    assert words[0] == "trainbox", line
    return subprocess.run(trainbox_argv(1, *words[1:]), env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
