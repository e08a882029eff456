"""Every guarantee, re-proved on the shipped user packages (issue 14: "your training, not a demo").

Each example is a real-shaped package under examples/ that fills trainbox's seams with its own
code (dict batches, its own step, metrics, prediction columns, optimizer, schedule, state). For
each row of EXAMPLES, with real processes:

1. it trains to its target;
2. a preemption signal stops it with exit 143; running it again, with a rank killed with
   SIGKILL mid-way and restarted, ends with the reference run's params_sha256 and user state.
   Both runs start from nothing, so this also proves that one config run twice agrees (the rows
   of RESUMED: those whose own code holds state);
3. `trainbox eval` gives the same user metrics at 1 and 3 processes on a validation set
   neither 2 nor 3 divides, and the same counts as the trainer's own validation at 2 (the rows
   of INFERRED);
4. `trainbox predict` writes the same bytes at 1 and 3 processes (the same rows);
5. it runs under real torchrun with 2 processes (mpirun and srun: tests/launchers/
   test_example_launchers.py).

One reference run per example (torchrun, 2 processes) serves them all. To cover another
example, add its row to EXAMPLES: the tests know nothing else about it.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from runs import clean_env, summary, train, trainbox_argv

pytestmark = pytest.mark.slow

EXAMPLES_DIR = Path(__file__).parents[2] / "examples"
BOUNDS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le}


@dataclass(frozen=True)
class Example:
    """What the tests need to know about one example package, and nothing more."""

    # The folder under examples/: it goes on PYTHONPATH and holds the config.
    name: str
    # Overrides that keep a CI run to seconds; README.md says what they change.
    quick: tuple[str, ...]
    # {val metric: (">=" or "<=", bound)}: the target, far from what a random guess scores.
    targets: dict[str, tuple[str, float]]
    # The user eval step's metric names (val_<name> in summary.json and `trainbox eval`).
    metrics: tuple[str, ...]
    # Metrics whose sums count whole things (hits, samples): exact at every world size.
    counted: tuple[str, ...]
    # The header `trainbox predict` writes with the example's predict step.
    columns: tuple[str, ...]
    # The config under the folder that these runs use.
    config_file: str = "config.yaml"

    @property
    def pythonpath(self) -> Path:
        return EXAMPLES_DIR / self.name

    @property
    def config(self) -> Path:
        return EXAMPLES_DIR / self.name / self.config_file


EXAMPLES = (
    Example(
        name="locator",
        # Half the steps, 301 validation tiles: still far past a random guess (0.5, ~25 px).
        quick=("train.max_steps=150", "train.eval_every=50", "data.args.val_size=301"),
        targets={"val_presence_accuracy": (">=", 0.95), "val_localisation_error_px": ("<=", 2.0)},
        metrics=("localisation_error_px", "presence_accuracy"),
        counted=("presence_accuracy",),
        columns=("index", "presence", "x", "y"),
    ),
    Example(
        name="tabular_dict",
        # A quarter of the steps: accuracy ~0.83 against a guess's 0.5 (the rule's noise caps
        # any model near 0.84).
        quick=("train.max_steps=100", "train.eval_every=50"),
        targets={"val_accuracy": (">=", 0.8), "val_log_loss": ("<=", 0.45)},
        metrics=("accuracy", "log_loss"),
        counted=("accuracy",),
        columns=("index", "churn_probability", "churns"),
    ),
    Example(
        name="masked_autoencoder",
        # The fine-tune from random weights (test_example_mae.py proves the pretrained start
        # beats it): 24 labelled clips, 101 to validate; a guess scores 0.25.
        quick=("train.init_from=", "data.args.val_size=101"),
        targets={"val_accuracy": (">=", 0.45)},
        metrics=("accuracy",),
        counted=("accuracy",),
        columns=(
            "index",
            "label",
            "probability_0",
            "probability_1",
            "probability_2",
            "probability_3",
        ),
        config_file="finetune.yaml",
    ),
)
# For every example: checkpoints often enough that a kill loses some steps but not all, one
# thread per rank (thread counts can change CPU numerics: runs under each launcher compare).
COMMON = ("train.log_every=10", "train.ckpt_every=10", "train.keep_last=20",
          "pinning.num_threads=1")  # fmt: skip
NODE_MODE = ("dist.procs_per_node=2",)
# 3 ranks get unequal shares of the validation set; 2 is the reference's own world size (its
# last validation), and tests/dist/test_eval_predict.py runs the built-in example at 2 too.
WORLDS = (1, 3)


def argv(example: Example) -> list[str]:
    """The example's own config with the quick CI overrides: the arguments after `run`."""
    return ["--config", str(example.config), *example.quick, *COMMON]


def run_example(
    example: Example, run_dir: Path, *extra: str, nproc: int = 1, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return train(run_dir, *argv(example), *extra, nproc=nproc, pythonpath=example.pythonpath,
                 **kwargs)  # fmt: skip


def trainbox(example: Example, nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`trainbox ARGS` with the example's package importable, waited for; must exit 0."""
    env = clean_env(PYTHONPATH=str(example.pythonpath))
    proc = subprocess.run(trainbox_argv(nproc, *args), env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, (
        f"{example.name} {args}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    )
    return proc


def digest(value: Any) -> str:
    """SHA-256 of nested containers of tensors and scalars, by content."""
    hasher = hashlib.sha256()

    def feed(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            hasher.update(f"{item.dtype}{tuple(item.shape)}".encode())
            hasher.update(item.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
        elif isinstance(item, dict):
            for key in sorted(item, key=str):
                hasher.update(repr(key).encode())
                feed(item[key])
        elif isinstance(item, list | tuple):
            for element in item:
                feed(element)
        else:
            hasher.update(repr(item).encode())

    feed(value)
    return hasher.hexdigest()


def extra_state(run_dir: Path) -> str:
    """The digest of the user state (train.state_factory) in the run's last checkpoint."""
    payload = torch.load(run_dir / "checkpoints" / "latest", weights_only=True)
    return digest(payload["extra_state"])


@dataclass(frozen=True)
class Reference:
    example: Example
    run_dir: Path

    @property
    def sha(self) -> str:
        return str(summary(self.run_dir)["params_sha256"])

    @property
    def steps(self) -> int:
        return int(summary(self.run_dir)["steps"])


@pytest.fixture(scope="module", params=EXAMPLES, ids=lambda example: example.name)
def reference(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Reference:
    """The example's uninterrupted run under real torchrun, 2 processes."""
    example: Example = request.param
    run_dir = tmp_path_factory.mktemp(f"{example.name}-reference")
    run_example(example, run_dir, nproc=2)
    return Reference(example, run_dir)


def test_it_trains_to_its_target(reference: Reference) -> None:
    found = summary(reference.run_dir)["val_metrics"]
    for name, (bound, value) in reference.example.targets.items():
        assert BOUNDS[bound](found[name], value), f"{reference.example.name}: {name}={found[name]}"


def test_it_runs_under_torchrun_with_its_own_steps(reference: Reference) -> None:
    result = summary(reference.run_dir)
    assert (result["launcher"], result["world_size"]) == ("torchrun", 2)
    manifest = json.loads((reference.run_dir / "run.json").read_text())
    # The example's own step trained it, and its own eval step made the metrics.
    assert manifest["user_code"]["train.step"] != "none", manifest["user_code"]
    assert sorted(result["val_metrics"]) == sorted(
        [*(f"val_{name}" for name in reference.example.metrics), "val_samples"]
    )


# The examples whose own code holds state a resume must restore: locator's one-cycle schedule
# and its step, tabular_dict's EMA. The MAE fine-tune adds none of its own, and each row costs a
# whole run (the generic seams resume in test_your_training.py, the MAE masks in
# test_example_mae.py).
RESUMED = [example for example in EXAMPLES if example.name != "masked_autoencoder"]


@pytest.mark.parametrize("reference", RESUMED, ids=lambda example: example.name, indirect=True)
def test_a_preempted_run_rerun_with_a_rank_killed_ends_with_the_same_params(
    reference: Reference, tmp_path: Path
) -> None:
    # One resume from the stop's own checkpoint, one from the last periodic checkpoint: the
    # kill lands between two of them, so the restart must redo the steps since the last one.
    third = reference.steps // 3
    signal = {"TRAINBOX_FAULT": f"signal:rank=1:step={third}:sig=USR1"}
    stopped = run_example(reference.example, tmp_path, *NODE_MODE, env=signal, check=False)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert not (tmp_path / "summary.json").exists()
    kill = {
        "TRAINBOX_FAULT": f"kill:rank=1:step={2 * third + 3}",
        "TRAINBOX_FAULT_ONCE": str(tmp_path / "once"),
    }
    proc = run_example(reference.example, tmp_path, *NODE_MODE, "dist.max_restarts=1",
                       env=kill, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "once.0").exists(), "the kill never fired"
    # Every rank logs its resume: two resumes are two distinct steps.
    resumed = {int(found[1]) for line in proc.stderr.splitlines() if '"event": "resumed"' in line
               for found in [re.search(r'"step": (\d+)', line)] if found}  # fmt: skip
    assert len(resumed) == 2, (resumed, proc.stderr[-3000:])
    assert min(resumed) >= third, resumed
    assert summary(tmp_path)["params_sha256"] == reference.sha
    # The user's own state (an EMA) was restored and went on as if never interrupted.
    assert extra_state(tmp_path) == extra_state(reference.run_dir)


# The examples whose eval and predict run at 1 and 3 processes. The MAE fine-tune's eval and
# predict steps are a plain classifier's, which the other rows and tests/dist/test_eval_predict.py
# already take through those paths (its prediction columns: test_example_mae.py), and each row
# costs four more processes.
INFERRED = [example for example in EXAMPLES if example.name != "masked_autoencoder"]


@pytest.fixture(scope="module")
def evaluated(
    reference: Reference, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, dict[str, Any]]:
    """World size → `trainbox eval`'s val_metrics for the reference's last checkpoint."""
    out = tmp_path_factory.mktemp(f"{reference.example.name}-eval")
    for n in WORLDS:
        trainbox(reference.example, n, "eval", "--checkpoint", str(reference.run_dir),
                 "--output", str(out / f"{n}.json"))  # fmt: skip
    return {n: json.loads((out / f"{n}.json").read_text())["val_metrics"] for n in WORLDS}


@pytest.mark.parametrize("reference", INFERRED, ids=lambda example: example.name, indirect=True)
def test_eval_gives_the_same_user_metrics_at_1_and_3_processes(
    reference: Reference, evaluated: dict[int, dict[str, Any]]
) -> None:
    example, first = reference.example, evaluated[1]
    # A size neither 2 nor 3 divides: ranks get unequal shares, and padding would show.
    assert first["val_samples"] % 2 == 1
    assert first["val_samples"] % 3 != 0
    for n in WORLDS:
        metrics = evaluated[n]
        assert sorted(metrics) == sorted(
            [*(f"val_{name}" for name in example.metrics), "val_samples"]
        )
        assert metrics["val_samples"] == first["val_samples"]
        for name in example.metrics:
            key = f"val_{name}"
            if name in example.counted:
                # Whole counts over whole counts: every sample is counted once at any world size.
                assert metrics[key] == first[key], (n, key)
            else:
                # Float sums: each rank's batches hold other samples at another world size, so
                # the float32 additions inside a batch come in another order.
                assert metrics[key] == pytest.approx(first[key], rel=1e-6), (n, key)
    # The trainer's own last validation, at 2 processes, ran the same step over the same set.
    trained = summary(reference.run_dir)["val_metrics"]
    assert trained["val_samples"] == first["val_samples"]
    for name in example.counted:
        assert trained[f"val_{name}"] == first[f"val_{name}"]


@pytest.mark.parametrize("reference", INFERRED, ids=lambda example: example.name, indirect=True)
def test_predict_writes_the_same_bytes_at_1_and_3_processes(
    reference: Reference, tmp_path: Path
) -> None:
    found = {}
    for n in WORLDS:
        output = tmp_path / f"{n}.csv"
        trainbox(reference.example, n, "predict", "--checkpoint", str(reference.run_dir),
                 "--output", str(output), "--chunk-size", "64")  # fmt: skip
        found[n] = output.read_bytes()
    assert found[3] == found[1]
    rows = found[1].decode().splitlines()
    samples = summary(reference.run_dir)["val_metrics"]["val_samples"]
    assert len(rows) == 1 + samples
    assert rows[0] == ",".join(reference.example.columns)
