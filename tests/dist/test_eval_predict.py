"""`trainbox eval` and `trainbox predict` for real, under torchrun with 1, 2 and 3 processes.

The validation set has 1001 samples, so no world size here divides it: a DistributedSampler
would pad the last shard with repeats. Eval must count each sample once, and predict must write
the same bytes at every world size, also after a kill and a rerun.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from runs import QUICK, clean_env, summary, train, trainbox_argv

pytestmark = pytest.mark.slow

VAL_SIZE = 1001
CHUNK = ["--chunk-size", "100"]  # 11 parts, the last one short
# 3 ranks get unequal shares of the 1001 samples; the node-mode eval below runs 2.
WORLDS = (1, 3)


def trainbox(
    nproc: int, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`trainbox ARGS` (under torchrun when nproc > 1), waited for."""
    return subprocess.run(trainbox_argv(nproc, *args), env=clean_env() | dict(env or {}),
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def events(stderr: str, name: str) -> list[dict[str, Any]]:
    """trainbox's JSON log lines called `name`."""
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == name]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quick one-process run whose validation set (1001 samples) no world size here divides."""
    run = tmp_path_factory.mktemp("trained") / "run"
    train(run, *QUICK, f"data.args.val_size={VAL_SIZE}")
    return run


@pytest.fixture(scope="module")
def evaluated(
    run_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, tuple[dict[str, Any], str]]:
    """World size → (eval's JSON, its stdout), for the run's latest checkpoint."""
    out = tmp_path_factory.mktemp("eval")
    found = {}
    for n in WORLDS:
        proc = ok(
            trainbox(n, "eval", "--checkpoint", str(run_dir), "--output", str(out / f"{n}.json"))
        )
        found[n] = (json.loads((out / f"{n}.json").read_text()), proc.stdout)
    return found


@pytest.fixture(scope="module")
def predicted(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, bytes]:
    """World size → predict's CSV bytes."""
    out = tmp_path_factory.mktemp("predict")
    for n in WORLDS:
        ok(
            trainbox(
                n,
                "predict",
                "--checkpoint",
                str(run_dir),
                "--output",
                str(out / f"{n}.csv"),
                *CHUNK,
            )
        )
    return {n: (out / f"{n}.csv").read_bytes() for n in WORLDS}


def test_eval_counts_every_sample_once_at_every_world_size(
    evaluated: dict[int, tuple[dict[str, Any], str]],
) -> None:
    for n, (result, _) in evaluated.items():
        assert (result["world_size"], result["val_metrics"]["val_samples"]) == (n, VAL_SIZE)


def test_eval_metrics_agree_across_world_sizes(
    evaluated: dict[int, tuple[dict[str, Any], str]],
) -> None:
    """Float sums too, to the last bit: each batch is the same at every world size."""
    metrics = {n: result["val_metrics"] for n, (result, _) in evaluated.items()}
    assert all(metrics[n] == metrics[1] for n in WORLDS), metrics


@pytest.mark.parametrize("world", WORLDS)
def test_eval_of_the_final_checkpoint_equals_the_trainers_own_evaluation(
    run_dir: Path, evaluated: dict[int, tuple[dict[str, Any], str]], world: int
) -> None:
    result, _ = evaluated[world]
    trained = summary(run_dir)["val_metrics"]
    assert result["step"] == 40
    assert result["val_metrics"] == trained
    assert result["checkpoint"].endswith("checkpoints/step-00000040.pt")


def test_eval_prints_one_line_on_rank_zero(
    evaluated: dict[int, tuple[dict[str, Any], str]],
) -> None:
    result, stdout = evaluated[3]
    (line,) = stdout.splitlines()
    assert line.startswith(
        f"evaluated step-00000040.pt (step 40) on {VAL_SIZE} samples with 3 processes: val_loss="
    )
    assert f"val_accuracy={result['val_metrics']['val_accuracy']:.6g}" in line


def test_predict_writes_the_same_bytes_at_every_world_size(predicted: dict[int, bytes]) -> None:
    assert predicted[3] == predicted[1]


def test_predict_writes_one_row_per_input_in_input_order(predicted: dict[int, bytes]) -> None:
    table = list(csv.reader(io.StringIO(predicted[1].decode())))
    assert table[0] == ["index", "predicted", "target", *(f"prob_{k}" for k in range(5))]
    body = table[1:]
    assert [int(row[0]) for row in body] == list(range(VAL_SIZE))
    for row in body:
        probabilities = [float(p) for p in row[3:]]
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-5)
        assert int(row[1]) == max(range(5), key=lambda k: probabilities[k])


def test_predict_writes_the_datas_own_labels_beside_the_predictions(
    run_dir: Path, predicted: dict[int, bytes]
) -> None:
    """The target column is the validation set's labels: scored against it, the predictions
    give the run's own accuracy (up to an argmax tie that another batch could flip)."""
    body = list(csv.reader(io.StringIO(predicted[1].decode())))[1:]
    assert {int(row[2]) for row in body} == set(range(5))
    right = sum(row[1] == row[2] for row in body) / VAL_SIZE
    trained = summary(run_dir)["val_metrics"]["val_accuracy"]
    assert right == pytest.approx(trained, abs=2 / VAL_SIZE)


def test_predict_jsonl_holds_the_same_predictions(
    run_dir: Path, predicted: dict[int, bytes], tmp_path: Path
) -> None:
    ok(
        trainbox(
            1,
            "predict",
            "--checkpoint",
            str(run_dir),
            "--output",
            str(tmp_path / "p.jsonl"),
            *CHUNK,
        )
    )
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    table = list(csv.reader(io.StringIO(predicted[1].decode())))[1:]
    assert [(r["index"], r["predicted"], r["target"], r["probabilities"]) for r in rows] == [
        (int(t[0]), int(t[1]), int(t[2]), [float(p) for p in t[3:]]) for t in table
    ]


# What DCP (torch.distributed.checkpoint) imports, fsdp among it: 0.6 CPU-s of a process's start-up.
SHARDED_ONLY = ("torch.distributed.checkpoint", "torch.distributed.fsdp")


@pytest.mark.parametrize("command", ["eval", "predict"])
def test_a_one_file_checkpoint_is_read_without_loading_dcp(
    run_dir: Path, tmp_path: Path, command: str
) -> None:
    # Python's own import log (-X importtime) names every module the process imported.
    proc = ok(trainbox(1, command, "--checkpoint", str(run_dir), "--output",
                       str(tmp_path / "out.csv"), env={"PYTHONPROFILEIMPORTTIME": "1"}))  # fmt: skip
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}  # fmt: skip
    assert "torch" in imported
    assert sorted(name for name in imported if name.startswith(SHARDED_ONLY)) == []


def test_a_killed_prediction_redoes_only_the_missing_parts(
    run_dir: Path, predicted: dict[int, bytes], tmp_path: Path
) -> None:
    output = tmp_path / "p.csv"
    argv = ["predict", "--checkpoint", str(run_dir), "--output", str(output), *CHUNK]
    # Three ranks: rank 0 dies of SIGKILL right after its 4th part file (mid-round) is durable.
    killed = trainbox(3, *argv, env={"TRAINBOX_PREDICT_KILL": "parts=4"})
    assert killed.returncode != 0
    assert "SIGKILL" in killed.stderr
    assert not output.exists()
    kept = sorted(p.name for p in (tmp_path / "p.csv.parts").glob("part-*"))
    assert kept == [f"part-{n:08d}.csv" for n in range(4)]
    # Rerun with another world size: chunks do not depend on it, so every part is reusable.
    rerun = ok(trainbox(2, *argv))
    (plan,) = events(rerun.stderr, "prediction parts")
    assert (plan["reused"], plan["computing"]) == ([0, 1, 2, 3], list(range(4, 11)))
    written = [
        n for event in events(rerun.stderr, "prediction parts written") for n in event["parts"]
    ]
    assert sorted(written) == list(range(4, 11))
    assert output.read_bytes() == predicted[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"]


def test_a_prediction_killed_while_merging_leaves_no_output_and_loses_no_part(
    run_dir: Path, predicted: dict[int, bytes], tmp_path: Path
) -> None:
    output = tmp_path / "p.csv"
    argv = ["predict", "--checkpoint", str(run_dir), "--output", str(output), *CHUNK]
    killed = trainbox(1, *argv, env={"TRAINBOX_PREDICT_KILL": "merge"})
    assert killed.returncode == -9
    assert not output.exists()
    assert [p.name for p in tmp_path.glob(".p.csv.*.tmp")]  # the torso is hidden, never p.csv
    rerun = ok(trainbox(1, *argv))
    (plan,) = events(rerun.stderr, "prediction parts")
    assert (plan["reused"], plan["computing"]) == (list(range(11)), [])
    assert output.read_bytes() == predicted[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"]


BAD_INPUTS = [
    (
        ["predict", "--checkpoint", "{tmp}/nope.pt", "--output", "{tmp}/p.csv"],
        "--checkpoint '{tmp}/nope.pt' does not exist",
    ),
    (
        ["eval", "--checkpoint", "{tmp}/damaged.pt"],
        "--checkpoint '{tmp}/damaged.pt': damaged.pt does not match its checksum",
    ),
    (
        ["eval", "--checkpoint", "{run}", "model.args.hidden=64"],
        "step-00000040.pt' was made with model config",
    ),
    (
        ["predict", "--checkpoint", "{run}", "--output", "{tmp}/existing.csv"],
        "--output '{tmp}/existing.csv' already exists",
    ),
    (
        ["eval", "--checkpoint", "{run}", "--output", "{tmp}/existing.json"],
        "--output '{tmp}/existing.json' already exists",
    ),
    (
        ["predict", "--checkpoint", "{run}", "--output", "{tmp}/p.txt"],
        "--output '{tmp}/p.txt' has extension '.txt'",
    ),
    (
        ["eval", "--checkpoint", "{run}", "data.factory=wide_pkg:data"],
        "the val split: the model does not fit the data: a batch of inputs (64, 3)",
    ),
    (
        [
            "predict",
            "--checkpoint",
            "{run}",
            "--output",
            "{tmp}/p.csv",
            "data.factory=wide_pkg:no_val",
        ],
        "data.factory='wide_pkg:no_val' returns no validation set",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_exits_2_naming_the_culprit_and_touches_nothing(
    run_dir: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    _bad_input_files(run_dir, tmp_path)
    before = _snapshot(tmp_path, run_dir)
    argv = [arg.format(tmp=tmp_path, run=run_dir) for arg in args]
    proc = trainbox(1, *argv, env={"PYTHONPATH": str(tmp_path / "pkg")})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == ""
    (line,) = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert line.startswith("trainbox: error: ")
    assert message.format(tmp=tmp_path, run=run_dir) in line
    assert " HINT: " in line
    assert _snapshot(tmp_path, run_dir) == before


def test_eval_in_node_mode_starts_its_workers(
    run_dir: Path, evaluated: dict[int, tuple[dict[str, Any], str]], tmp_path: Path
) -> None:
    # One process that wants two workers (as a pod or `srun --ntasks-per-node=1` would) supervises
    # torchrun around them, as `run` does.
    proc = ok(
        trainbox(
            1,
            "eval",
            "--checkpoint",
            str(run_dir),
            "--output",
            str(tmp_path / "e.json"),
            "dist.procs_per_node=2",
        )
    )
    assert "torch.distributed.run" in proc.stderr
    assert (
        json.loads((tmp_path / "e.json").read_text())["val_metrics"]
        == evaluated[1][0]["val_metrics"]
    )


def test_bad_input_in_node_mode_exits_2(run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "existing.csv").write_text("keep me\n")
    proc = trainbox(
        1,
        "predict",
        "--checkpoint",
        str(run_dir),
        "--output",
        str(tmp_path / "existing.csv"),
        "dist.procs_per_node=2",
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "already exists" in proc.stderr
    assert (tmp_path / "existing.csv").read_text() == "keep me\n"


def test_debug_turns_on_torch_distributed_detail(run_dir: Path) -> None:
    proc = ok(trainbox(2, "eval", "--debug", "--checkpoint", str(run_dir)))
    # torch's own line (c10d's INFO lines show because --debug sets TORCH_CPP_LOG_LEVEL too), once per rank.
    assert proc.stderr.count("[c10d] The debug level is set to DETAIL.") == 2
    (debugging, _) = events(proc.stderr, "debugging")
    assert "TORCH_DISTRIBUTED_DEBUG" in debugging["set"]


def test_debug_in_node_mode_reaches_the_workers(tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text("dist:\n  procs_per_node: 2\n")
    # One write per worker: print() writes its pieces one by one, and with the two workers on
    # one unbuffered pipe they interleaved once ('01 INFO WARN' and ' INFO WARN').
    code = (
        "import os; e = os.environ; os.write(1, f\"{e['RANK']} {e['TORCH_DISTRIBUTED_DEBUG']}"
        " {e['NCCL_DEBUG']}\\n\".encode())"
    )
    proc = ok(
        trainbox(
            1,
            "exec",
            "--debug",
            "--config",
            str(tmp_path / "node.yaml"),
            "--",
            "python",
            "-c",
            code,
            env={"NCCL_DEBUG": "WARN"},
        )
    )
    # INFO, not DETAIL: a CPU script's DDP runs over gloo (see test_debug_env's table).
    assert sorted(proc.stdout.splitlines()) == ["0 INFO WARN", "1 INFO WARN"]


def test_run_debug_on_cpu_trains(tmp_path: Path) -> None:
    # DETAIL would segfault DDP's constructor over gloo (torch 2.13); --debug asks for INFO there.
    proc = train(tmp_path / "run", "--debug", "train.max_steps=3", "train.eval_every=0")
    assert "[c10d] The debug level is set to INFO." in proc.stderr
    assert summary(tmp_path / "run")["steps"] == 3


def _bad_input_files(run_dir: Path, root: Path) -> None:
    (root / "existing.csv").write_text("keep me\n")
    (root / "existing.json").write_text("{}\n")
    damaged = root / "damaged.pt"
    source = run_dir / "checkpoints" / "step-00000035.pt"
    damaged.write_bytes(source.read_bytes()[:2000])
    shutil.copy(source.with_name(source.name + ".sha256"), damaged.with_name("damaged.pt.sha256"))
    (root / "pkg" / "wide_pkg").mkdir(parents=True)
    (root / "pkg" / "wide_pkg" / "__init__.py").write_text(
        "import torch\n"
        "from torch.utils.data import TensorDataset\n"
        # **args: the run's config passes the spirals' data.args (val_size) along.
        "def data(**args):\n    points = TensorDataset(torch.ones(64, 3), torch.zeros(64, dtype=torch.long))\n    return points, points\n"
        "def no_val(**args):\n    return TensorDataset(torch.ones(64, 2), torch.zeros(64, dtype=torch.long)), None\n"
    )


def _snapshot(*roots: Path) -> dict[str, str]:
    # __pycache__ appears when the test's own factory package is imported.
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for root in roots for p in sorted(root.rglob("*")) if "__pycache__" not in p.parts}  # fmt: skip
