"""A user's `train.eval_step` and `train.predict_step` on dict batches, for real, at 1, 2 and 3
processes: `trainbox run` validates with them, `trainbox eval` sums their metrics exactly and
`trainbox predict` writes their columns byte for byte alike; a bad return is exit 2 everywhere.

The user package lives in tmp_path: training reads (inputs, targets) pairs, the validation set
(101 samples, which neither 2 nor 3 divides) nested dicts {"image", "target", "meta": {"id"}}.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from runs import by_hand, clean_env, summary, train, trainbox_argv

pytestmark = pytest.mark.slow

VAL_SIZE = 101
# 101 samples: 3 ranks get unequal shares, and one rank is the reference.
WORLDS = (1, 3)
PACKAGE = '''
import torch
from torch.utils.data import Dataset

from trainbox.train.data.contract import Datasets

PIXELS = 4


class Images(Dataset):
    """`size` images of PIXELS pixels; the target of each is the image reversed."""

    def __init__(self, size, seed, *, nested):
        self.images = torch.rand(size, PIXELS, generator=torch.Generator().manual_seed(seed))
        self.nested = nested

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        image, target = self.images[index], self.images[index].flip(0)
        if not self.nested:
            return image, target
        return {"image": image, "target": target, "meta": {"id": torch.tensor(1000 + index)}}


def model():
    return torch.nn.Linear(PIXELS, PIXELS)


def data(val_size=101):
    return Datasets(train=Images(256, 0, nested=False), val=Images(val_size, 1, nested=True))


def pixel_error(model, batch):
    # A mean over pixels (counted in pixels) and a share of samples (counted in samples).
    error = (model(batch["image"]) - batch["target"]).abs()
    close = (error.mean(dim=1) < 0.3).sum()
    return {"pixel_error": (error.sum(), error.numel()), "close": (close, len(error))}


def predictions(model, batch):
    ids = batch["meta"]["id"]
    return {
        "pixels": model(batch["image"]),
        "id": ids,
        "parity": ["odd" if i % 2 else "even" for i in ids.tolist()],
    }


def mean_on_one_rank(model, batch):
    # Wrong only for sample 1: at 2 processes only rank 1 sees it, and rank 0 must stop too.
    if 1001 in batch["meta"]["id"].tolist():
        return {"pixel_error": (model(batch["image"]) - batch["target"]).abs().mean()}
    return pixel_error(model, batch)


def short_on_one_rank(model, batch):
    # Wrong only in the chunk of sample 95 (chunk 9 of 10: rank 1's at 2 processes).
    found = predictions(model, batch)
    if 1095 in batch["meta"]["id"].tolist():
        found["pixels"] = found["pixels"][:1]
    return found
'''
STEPS = ["model.factory=pixels:model", "data.factory=pixels:data", "train.loss=mse",
         "train.eval_step=pixels:pixel_error", "train.batch_size=8", "train.log_every=10"]  # fmt: skip
PREDICT = ["train.predict_step=pixels:predictions", "--chunk-size", "10"]


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("user")
    (root / "pixels").mkdir()
    (root / "pixels" / "__init__.py").write_text(PACKAGE)
    return root


def trainbox(
    nproc: int, package: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`trainbox ARGS` with the user package importable, waited for."""
    env_ = clean_env(PYTHONPATH=str(package)) | dict(env or {})
    return subprocess.run(trainbox_argv(nproc, *args), env=env_, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def rank_error(stderr: str) -> str:
    """The one error line a rank printed."""
    (line,) = [line for line in stderr.splitlines() if line.startswith("trainbox: error: ")]
    return line


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error: ")]


@pytest.fixture(scope="module")
def run_dir(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    steps = ["train.max_steps=30", "train.eval_every=10", "optim.lr=0.05"]
    train(run, *STEPS, *steps, pythonpath=package)
    return run


@pytest.fixture(scope="module")
def evaluated(
    package: Path, run_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, dict[str, Any]]:
    """World size → eval's val_metrics for the run's last checkpoint (the run's own config)."""
    out = tmp_path_factory.mktemp("eval")
    for n in WORLDS:
        ok(
            trainbox(
                n, package, "eval", "--checkpoint", str(run_dir), "--output", str(out / f"{n}")
            )
        )
    return {n: json.loads((out / f"{n}").read_text())["val_metrics"] for n in WORLDS}


def expected_metrics(run_dir: Path) -> dict[str, float]:
    """The whole validation set's metrics, computed here in one float64 pass."""
    payload = torch.load(run_dir / "checkpoints" / "latest", weights_only=True)
    model = torch.nn.Linear(4, 4).double()
    model.load_state_dict(payload["model"])
    images = torch.rand(VAL_SIZE, 4, generator=torch.Generator().manual_seed(1)).double()
    with torch.no_grad():
        error = (model(images) - images.flip(1)).abs()
    close = (error.mean(dim=1) < 0.3).sum().item()
    return {"val_pixel_error": error.mean().item(), "val_close": close / VAL_SIZE}


def test_user_metrics_are_exact_and_agree_at_every_world_size(
    run_dir: Path, evaluated: dict[int, dict[str, Any]]
) -> None:
    expected = expected_metrics(run_dir)
    assert 0 < expected["val_close"] < 1  # a count that tells samples apart
    for n in WORLDS:
        metrics = evaluated[n]
        assert list(metrics) == ["val_close", "val_pixel_error", "val_samples"]  # sorted file
        assert metrics["val_samples"] == VAL_SIZE
        assert metrics["val_close"] == evaluated[1]["val_close"] == expected["val_close"]
        # The model ran in float32 here and in float64 in expected_metrics.
        assert metrics["val_pixel_error"] == pytest.approx(expected["val_pixel_error"], rel=1e-6)
        # Float sums to the last bit: each batch holds the same samples at every world size.
        assert metrics["val_pixel_error"] == evaluated[1]["val_pixel_error"]


def test_the_trainer_validates_with_the_user_step(
    run_dir: Path, evaluated: dict[int, dict[str, Any]]
) -> None:
    trained = summary(run_dir)["val_metrics"]
    assert trained["val_close"] == evaluated[1]["val_close"]
    # One process both times: the same batches, so the same bits.
    assert trained["val_pixel_error"] == evaluated[1]["val_pixel_error"]
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["kind"] == "val"] == [10, 20, 30]
    assert {r["val_samples"] for r in logged if r["kind"] == "val"} == {VAL_SIZE}


# lr 0: the weights stay the factory's, so validation must agree at every world size.
UNTRAINED = ["train.max_steps=2", "optim.lr=0"]


@pytest.fixture(scope="module")
def untrained(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-process run of UNTRAINED with the user's eval step."""
    run = tmp_path_factory.mktemp("untrained") / "run"
    train(run, *STEPS, *UNTRAINED, pythonpath=package)
    return run


def test_the_trainers_validation_agrees_across_world_sizes(
    package: Path, untrained: Path, tmp_path: Path
) -> None:
    train(tmp_path, *STEPS, *UNTRAINED, nproc=3, pythonpath=package)
    found = {1: summary(untrained)["val_metrics"], 3: summary(tmp_path)["val_metrics"]}
    assert found[3] == found[1]
    assert found[1]["val_samples"] == VAL_SIZE


@pytest.fixture(scope="module")
def predicted(
    package: Path, run_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[int, str], bytes]:
    """(world size, format) → predict's output bytes."""
    out = tmp_path_factory.mktemp("predict")
    found = {}
    # Parts and their merge do not depend on the format: jsonl is checked for its rows only.
    for n, fmt in ((1, "csv"), (3, "csv"), (1, "jsonl")):
        path = out / f"{n}.{fmt}"
        ok(trainbox(n, package, "predict", "--checkpoint", str(run_dir), "--output", str(path),
                    *PREDICT))  # fmt: skip
        found[n, fmt] = path.read_bytes()
    return found


def test_predict_writes_the_same_bytes_at_every_world_size(
    predicted: dict[tuple[int, str], bytes],
) -> None:
    assert predicted[3, "csv"] == predicted[1, "csv"]


def test_predict_writes_the_user_columns_one_row_per_input_in_order(
    predicted: dict[tuple[int, str], bytes],
) -> None:
    table = list(csv.reader(io.StringIO(predicted[1, "csv"].decode())))
    assert table[0] == ["index", "pixels_0", "pixels_1", "pixels_2", "pixels_3", "id", "parity"]
    body = table[1:]
    assert [int(row[0]) for row in body] == list(range(VAL_SIZE))
    # The id came through the nested batch: it names the same sample as the index.
    assert [int(row[5]) for row in body] == [1000 + i for i in range(VAL_SIZE)]
    assert [row[6] for row in body] == ["odd" if i % 2 else "even" for i in range(VAL_SIZE)]
    lines = [json.loads(line) for line in predicted[1, "jsonl"].decode().splitlines()]
    assert [list(line) for line in lines[:1]] == [["index", "pixels", "id", "parity"]]
    assert [line["pixels"] for line in lines] == [[float(v) for v in row[1:5]] for row in body]


def test_an_eval_step_wrong_on_one_rank_stops_every_rank_with_exit_2(
    package: Path, run_dir: Path
) -> None:
    results = by_hand("eval", "--checkpoint", str(run_dir),
                      "train.eval_step=pixels:mean_on_one_rank", env={"PYTHONPATH": str(package)})  # fmt: skip
    assert [code for code, _ in results] == [2, 2], results[0][1][-2000:] + results[1][1][-2000:]
    lines = [rank_error(stderr) for _, stderr in results]
    assert lines[0] == lines[1]  # both ranks, the same line
    assert "train.eval_step pixels:mean_on_one_rank returned" in lines[0]
    assert "'pixel_error': a tensor of shape ()" in lines[0]
    assert " HINT: " in lines[0]
    assert all("Traceback" not in stderr for _, stderr in results)


def test_a_predict_column_wrong_on_one_rank_stops_every_rank_with_exit_2(
    package: Path, run_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "p.csv"
    results = by_hand("predict", "--checkpoint", str(run_dir), "--output", str(output),
                      "train.predict_step=pixels:short_on_one_rank", "--chunk-size", "10",
                      env={"PYTHONPATH": str(package)})  # fmt: skip
    assert [code for code, _ in results] == [2, 2], results[0][1][-2000:] + results[1][1][-2000:]
    lines = [rank_error(stderr) for _, stderr in results]
    assert lines[0] == lines[1]
    assert "train.predict_step pixels:short_on_one_rank returned column 'pixels'" in lines[0]
    assert not output.exists()


def test_a_bad_eval_step_stops_training_with_exit_2(package: Path, tmp_path: Path) -> None:
    results = by_hand("run", f"run_dir={tmp_path / 'run'}", *STEPS, "train.max_steps=2",
                      "train.eval_step=pixels:mean_on_one_rank", env={"PYTHONPATH": str(package)})  # fmt: skip
    assert [code for code, _ in results] == [2, 2], results[0][1][-2000:] + results[1][1][-2000:]
    lines = [rank_error(stderr) for _, stderr in results]
    assert lines[0] == lines[1]
    assert "train.eval_step pixels:mean_on_one_rank returned" in lines[0]


@pytest.mark.parametrize(
    ("command", "key"),
    [(["eval"], "train.eval_step"), (["predict", "--output", "{tmp}/p.csv"], "train.predict_step")],
)
def test_the_builtin_steps_on_dict_batches_ask_for_a_user_step(
    package: Path, run_dir: Path, tmp_path: Path, command: list[str], key: str
) -> None:
    args = [arg.format(tmp=tmp_path) for arg in command]
    proc = trainbox(1, package, *args, "--checkpoint", str(run_dir), "train.eval_step=")
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = errors(proc)
    assert "the val split's samples are dict, not the (inputs, target) pairs" in line
    assert key in line
    assert list(tmp_path.iterdir()) == []


API_SCRIPT = """
import json, sys

import pixels
import trainbox

config = trainbox.load_config(None, sys.argv[1:])
with trainbox.init_distributed(timeout_s=config.dist.timeout_s, seed=config.seed) as session:
    model, data = pixels.model(), pixels.data()
    trainer = trainbox.Trainer(config, session, model=model, data=data, eval_step=pixels.pixel_error)
    print(json.dumps(trainer.fit().val_metrics))
"""


def test_the_api_takes_the_eval_step_as_a_function(
    package: Path, untrained: Path, tmp_path: Path
) -> None:
    (tmp_path / "script.py").write_text(API_SCRIPT)
    plain = [arg for arg in STEPS if not arg.startswith("train.eval_step=")]
    argv = [sys.executable, str(tmp_path / "script.py"), f"run_dir={tmp_path / 'api'}", *plain]
    script = subprocess.run([*argv, *UNTRAINED], env=clean_env(PYTHONPATH=str(package)),
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert script.returncode == 0, script.stderr[-3000:]
    # The CLI twin: the same run through `trainbox run`.
    assert json.loads(script.stdout.splitlines()[-1]) == summary(untrained)["val_metrics"]
