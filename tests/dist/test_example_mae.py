"""examples/masked_autoencoder (issue 14): pretraining a masked autoencoder on unlabelled clips
pays off in a small-data fine-tune that starts from its encoder through `train.init_from`.

Every run is a real `trainbox run` of the shipped configs with the package only on PYTHONPATH;
overrides shorten them to seconds (the shipped configs train longer, with the same margin).
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from runs import clean_env, summary, train, trainbox_argv

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[2] / "examples" / "masked_autoencoder"
PRETRAIN = ["--config", str(EXAMPLE / "pretrain.yaml"), "train.max_steps=300",
            "train.ckpt_every=300", "train.log_every=100"]  # fmt: skip
FINETUNE = ["--config", str(EXAMPLE / "finetune.yaml"), "train.max_steps=100",
            "train.eval_every=100", "train.ckpt_every=100", "data.args.val_size=500"]  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("mae") / "pretrain"
    train(run_dir, *PRETRAIN, pythonpath=EXAMPLE)
    return run_dir


def finetune(run_dir: Path, *args: str) -> dict[str, float]:
    train(run_dir, *FINETUNE, *args, pythonpath=EXAMPLE)
    return summary(run_dir)["val_metrics"]


@pytest.fixture(scope="module")
def finetuned(pretrained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fine-tune that starts from the pretrained encoder."""
    run_dir = tmp_path_factory.mktemp("mae") / "finetune"
    finetune(run_dir, f"train.init_from={pretrained}")
    return run_dir


def test_the_pretrained_encoder_beats_the_same_finetune_from_random_weights(
    pretrained: Path, finetuned: Path, tmp_path: Path
) -> None:
    ours = summary(finetuned)["val_metrics"]
    random = finetune(tmp_path / "random", "train.init_from=")
    print(f"val_accuracy: from the pretrained encoder {ours['val_accuracy']:.3f}, "
          f"from random weights {random['val_accuracy']:.3f}")  # fmt: skip
    assert ours["val_samples"] == random["val_samples"] == 500
    assert ours["val_accuracy"] >= random["val_accuracy"] + 0.15
    used = json.loads((finetuned / "run.json").read_text())["initialised_from"]
    assert used == str(pretrained / "checkpoints" / "step-00000300.pt")


def test_pretraining_twice_gives_the_same_params_sha256(pretrained: Path, tmp_path: Path) -> None:
    train(tmp_path, *PRETRAIN, pythonpath=EXAMPLE)
    assert summary(tmp_path)["params_sha256"] == summary(pretrained)["params_sha256"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train.init_prefix=decoder.layers"], "no tensor of the checkpoint matches the model's names"),
        (["model.args.width=32", "model.args.heads=2"], "shapes differ: position (1, 8, 48) vs the model's (1, 8, 32)"),
    ],
    ids=["prefix-names-nothing", "shapes-differ"],
)  # fmt: skip
def test_an_encoder_that_does_not_fit_is_one_exit_2_line(
    pretrained: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    proc = train(tmp_path, *FINETUNE, f"train.init_from={pretrained}", *args, check=False,
                 pythonpath=EXAMPLE)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert line.startswith("trainbox: error: train.init_from ")
    assert message in line
    assert " HINT: " in line
    assert not (tmp_path / "checkpoints").exists()


def test_predict_writes_a_label_and_a_probability_per_texture(
    finetuned: Path, tmp_path: Path
) -> None:
    output = tmp_path / "predictions.csv"
    argv = trainbox_argv(1, "predict", "--checkpoint", str(finetuned), "--output", str(output))
    proc = subprocess.run(argv, env=clean_env(PYTHONPATH=str(EXAMPLE)), capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(output.read_text().splitlines()))
    assert list(rows[0]) == ["index", "label", *(f"probability_{k}" for k in range(4))]
    assert [int(row["index"]) for row in rows] == list(range(500))
    for row in rows:
        probabilities = [float(row[f"probability_{k}"]) for k in range(4)]
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-4)
        assert max(range(4), key=probabilities.__getitem__) == int(row["label"])
