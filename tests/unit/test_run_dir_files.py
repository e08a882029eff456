"""Run outputs: the parameter fingerprint and metrics.jsonl upkeep."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from trainbox.atomic import write_json
from trainbox.process.provenance import Provenance
from trainbox.train.resume.run_dir import TrainSummary, image_record, read_summary, write_summary
from trainbox.train.resume.state import params_sha256
from trainbox.train.watch.metrics import MetricsFile


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))


def test_fingerprint_is_stable_and_sensitive() -> None:
    assert params_sha256(model(0)) == params_sha256(model(0))
    assert params_sha256(model(0)) != params_sha256(model(1))
    changed = model(0)
    with torch.no_grad():
        changed[0].bias[0] += 1e-7
    assert params_sha256(changed) != params_sha256(model(0))


def test_fingerprint_covers_dtype() -> None:
    assert params_sha256(model(0).to(torch.float64)) != params_sha256(model(0))
    assert len(params_sha256(model(0).to(torch.bfloat16))) == 64


def test_metrics_are_appended_by_rank_zero_only(tmp_path: Path) -> None:
    MetricsFile(tmp_path / "m.jsonl", enabled=False).append({"step": 1})
    assert not (tmp_path / "m.jsonl").exists()
    MetricsFile(tmp_path / "m.jsonl", enabled=True).append({"step": 1})
    assert (tmp_path / "m.jsonl").read_text() == '{"step": 1}\n'


def test_keep_until_drops_discarded_steps_and_a_cut_off_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (5, 10, 15)) + '{"step": 2')
    MetricsFile(path, enabled=True).keep_until(10)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [5, 10]


def test_keep_until_can_drop_the_evaluation_a_rerun_redoes(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    records = [
        {"kind": "train", "step": 10},
        {"kind": "val", "step": 10},
        {"kind": "val", "step": 5},
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    MetricsFile(path, enabled=True).keep_until(10, redo_eval=True)
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert kept == [{"kind": "train", "step": 10}, {"kind": "val", "step": 5}]


def test_the_last_logged_loss_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    metrics = MetricsFile(path, enabled=True)
    assert metrics.last_loss() is None
    for step, loss in ((5, 2.0), (10, 1.5)):
        metrics.append({"kind": "train", "step": step, "loss": loss})
    metrics.append({"kind": "val", "step": 10, "val_loss": 9.0})
    assert metrics.last_loss() == 1.5


def test_write_json_is_atomic(tmp_path: Path) -> None:
    write_json(tmp_path / "s.json", {"a": 1})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_write_json_writes_null_for_values_that_are_not_finite(tmp_path: Path) -> None:
    data = {"loss": float("nan"), "rates": [float("inf"), 1.5], "val": {"x": -float("inf")}}
    write_json(tmp_path / "s.json", data)
    # Strict JSON has no NaN or Infinity: a strict reader must accept the file.
    text = (tmp_path / "s.json").read_text()
    assert json.loads(text, parse_constant=pytest.fail) == {
        "loss": None, "rates": [None, 1.5], "val": {"x": None}
    }  # fmt: skip


def test_run_files_are_durable_before_they_are_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Atomic and durable": the data is fsynced before the rename, the directory after it.
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_json(tmp_path / "summary.json", {"steps": 3})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"steps": 3}
    assert len(synced) == 2
    assert Path(synced[0]).name.startswith(".summary.json.")  # the temp file, before the rename
    assert synced[1] == str(tmp_path)  # the directory entry, after it


@pytest.mark.parametrize(
    ("env", "image", "recorded"),
    [
        (
            {"TRAINBOX_IMAGE_REVISION": "4517e54", "TRAINBOX_IMAGE_VERSION": "0.1.0", "HOME": "/"},
            Provenance(lock_sha256="ab12", revision="4517e54"),
            {"revision": "4517e54", "version": "0.1.0", "lock_sha256": "ab12"},
        ),
        (
            {},
            Provenance(lock_sha256="ab12", revision="4517e54"),
            {"revision": "4517e54", "lock_sha256": "ab12"},
        ),
        ({}, Provenance(lock_sha256=None, revision=None), {"lock_sha256": None}),
    ],
    ids=["image", "labels-unset", "no-image"],
)
def test_run_json_records_the_image_lock_hash_and_revision(
    env: dict[str, str], image: Provenance, recorded: dict[str, object]
) -> None:
    assert image_record(env, image) == recorded


def test_a_summary_round_trips_through_its_file(tmp_path: Path) -> None:
    summary = TrainSummary(
        steps=40,
        world_size=2,
        launcher="torchrun",
        global_batch=128,
        final_loss=math.nan,
        val_metrics={"val_loss": 0.25},
        samples_per_s=1234.5,
        train_seconds=8.5,
        params_sha256="ab" * 32,
        skipped_samples=3,
    )
    write_summary(tmp_path, summary)
    record = read_summary(tmp_path)
    assert record is not None
    assert record["final_loss"] is None  # strict JSON has no NaN
    again = TrainSummary.from_record(record, already_complete=True)
    assert math.isnan(again.final_loss)
    assert again.already_complete
    rest = {key: value for key, value in summary.as_dict().items() if key != "final_loss"}
    assert {key: value for key, value in again.as_dict().items() if key in rest} == {
        **rest,
        "already_complete": True,
    }


def test_a_summary_written_by_an_older_trainbox_still_reads() -> None:
    old = {"steps": 40, "world_size": 2, "launcher": "slurm", "val_metrics": {"val_loss": 0.5}}
    summary = TrainSummary.from_record(old, already_complete=True)
    assert (summary.steps, summary.launcher, summary.val_metrics) == (
        40,
        "slurm",
        {"val_loss": 0.5},
    )
    assert summary.already_complete
    assert math.isnan(summary.samples_per_s)
    assert summary.skipped_samples is None
