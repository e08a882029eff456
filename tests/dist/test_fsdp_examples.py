"""train.strategy=fsdp trains every shipped example to DDP's validation metrics.

Each row runs one example twice with real torchrun, `train.strategy=ddp` and `=fsdp`, the same
config, seed and world size, in fp32 (`train.amp=off`), for a few dozen steps, and compares
the two runs' metrics. fp32 fsdp computes what DDP computes in another summation order (a
reduce-scatter instead of an all-reduce, per-unit gathers), so only rounding tells them apart:
RTOL bounds the float metrics, and counted ones (accuracies) may differ by a sample or two that
sit on a decision boundary. The built-in example at world 2 is compared parameter by parameter
in tests/dist/test_fsdp.py; here the CSV task runs at world 4.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runs import summary, train

pytestmark = pytest.mark.slow

EXAMPLES_DIR = Path(__file__).parents[2] / "examples"
# Short runs: the last step validates; one checkpoint, at the end (the finetune row reads it).
SHORT = ("train.max_steps=30", "train.log_every=10", "train.eval_every=30",
         "train.ckpt_every=30", "pinning.num_threads=1", "train.amp=off")  # fmt: skip
# Float metrics: the relative difference allowed between the fsdp and the DDP run. Measured
# (docs/fsdp.md): none at 2 ranks, where each sum has two terms and so one order; at most 3e-8
# at 4, so this leaves a margin of 300 for longer runs and other example data.
RTOL = 1e-5
# Counted metrics (a fraction of the validation samples): samples that may change class from
# such a difference (none did).
FLIPS = 1


@dataclass(frozen=True)
class Row:
    """One example's comparison run."""

    # The test id.
    name: str
    # The folder under examples/ put on PYTHONPATH (None: the built-in example).
    folder: str | None
    # The arguments after `run`, before SHORT and the strategy; {csv} and {pretrained} are
    # filled in from fixtures.
    args: tuple[str, ...]
    # summary.json's metrics compared: val_metrics names, or final_loss (a run with no val set).
    metrics: tuple[str, ...]
    # Ranks.
    world: int = 2


def config(folder: str, file: str = "config.yaml") -> str:
    return str(EXAMPLES_DIR / folder / file)


# The packages at two ranks; the CSV task at four only (two would add a run and nothing new).
ROWS = (
    Row("locator", "locator", ("--config", config("locator"), "data.args.train_size=1024",
        "data.args.val_size=301"), ("val_presence_accuracy", "val_localisation_error_px")),
    Row("tabular_dict", "tabular_dict", ("--config", config("tabular_dict"),
        "data.args.train_size=2048", "data.args.val_size=301"), ("val_accuracy", "val_log_loss")),
    Row("mae_pretrain", "masked_autoencoder", ("--config", config("masked_autoencoder",
        "pretrain.yaml"), "data.args.size=1024"), ("final_loss",)),
    Row("mae_finetune", "masked_autoencoder", ("--config", config("masked_autoencoder",
        "finetune.yaml"), "train.init_from={pretrained}", "data.args.val_size=301"),
        ("val_accuracy",)),
    Row("user_model", "user_model", ("--config", config("user_model"),
        "data.args.train_size=1000", "data.args.val_size=301"), ("val_accuracy", "val_loss")),
    Row("tabular", None, ("--config", config("tabular"),
        "data.args.train_csv={csv}/train.csv", "data.args.val_csv={csv}/val.csv"),
        ("val_accuracy", "val_loss"), world=4),
)  # fmt: skip
COUNTED = {"val_accuracy", "val_presence_accuracy"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Row, str, dict[str, Path]], Path]:
    """(row, strategy, placeholders) → the run_dir of the row's run, made once per module."""
    done: dict[tuple[str, str], Path] = {}

    def run(row: Row, strategy: str, fill: dict[str, Path]) -> Path:
        if (row.name, strategy) not in done:
            run_dir = tmp_path_factory.mktemp(f"{row.name}-{strategy}")
            args = [arg.format(**fill) for arg in row.args]
            path = EXAMPLES_DIR / row.folder if row.folder else None
            train(run_dir, *args, *SHORT, f"train.strategy={strategy}", nproc=row.world,
                  pythonpath=path)  # fmt: skip
            done[row.name, strategy] = run_dir
        return done[row.name, strategy]

    return run


def fill(request: pytest.FixtureRequest, row: Row) -> dict[str, Path]:
    """The placeholders the row's arguments name, from their fixtures."""
    names = [name for name in ("csv", "pretrained") if any(f"{{{name}}}" in a for a in row.args)]
    return {name: request.getfixturevalue(name) for name in names}


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/tabular's CSV files, a small draw of them."""
    out = tmp_path_factory.mktemp("csv")
    subprocess.run([sys.executable, str(EXAMPLES_DIR / "tabular" / "make_csv.py"), str(out),
                    "--train-rows", "1000", "--val-rows", "301"], check=True)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def pretrained(runs: Callable[[Row, str, dict[str, Path]], Path]) -> Path:
    """The pretraining row's DDP run: both fine-tunes start from it."""
    return runs(next(row for row in ROWS if row.name == "mae_pretrain"), "ddp", {})


@dataclass(frozen=True)
class Compared:
    row: Row
    # Strategy → the summary.json of the row's run under it.
    runs: dict[str, dict[str, Any]]


@pytest.fixture(scope="module", params=ROWS, ids=lambda row: row.name)
def compared(
    request: pytest.FixtureRequest, runs: Callable[[Row, str, dict[str, Path]], Path]
) -> Compared:
    """The row run under ddp and under fsdp."""
    row: Row = request.param
    filled = fill(request, row)
    return Compared(row, {s: summary(runs(row, s, filled)) for s in ("ddp", "fsdp")})


def metric(result: dict[str, Any], name: str) -> float:
    return float(result[name] if name == "final_loss" else result["val_metrics"][name])


def differences(compared: Compared) -> dict[str, tuple[float, float]]:
    """The row's metrics that differ beyond the tolerance: name → (ddp, fsdp)."""
    ddp, fsdp = compared.runs["ddp"], compared.runs["fsdp"]
    samples = ddp.get("val_metrics", {}).get("val_samples", 0)
    out = {}
    for name in compared.row.metrics:
        a, b = metric(ddp, name), metric(fsdp, name)
        close: Callable[[float, float], bool] = (
            (lambda x, y: abs(x - y) * samples <= FLIPS + 1e-9)
            if name in COUNTED
            else (lambda x, y: abs(x - y) <= RTOL * abs(x))
        )
        if not close(a, b):
            out[name] = (a, b)
    return out


def test_fsdp_ends_at_the_ddp_runs_metrics(compared: Compared) -> None:
    assert differences(compared) == {}
