"""The one checkpoint payload (issue 14): what the trainer writes is what resume, init_from and
eval/predict read, old files included, and weights that do not fit are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainbox.checkpoint import files, schema
from trainbox.checkpoint.schema import Payload


def full_payload() -> Payload:
    return Payload(
        step=7,
        model={"w": torch.ones(2)},
        config={"seed": 3, "model": {"factory": "pkg:make", "args": {"width": 4}}},
        config_hash="abc",
        optimizer={"state": {}, "param_groups": []},
        scheduler={"last_epoch": 7},
        scaler={},
        rng=[{"torch": torch.zeros(1, dtype=torch.uint8)}],
        extra_state={"ema": {"decay": 0.9}},
    )


def test_a_payload_written_and_loaded_reads_back_the_same(tmp_path: Path) -> None:
    written = full_payload()
    path = files.save(tmp_path, written.step, written.to_dict())
    read = schema.load(path)
    assert (read.step, read.config, read.config_hash, read.extra_state) == (
        7, written.config, "abc", {"ema": {"decay": 0.9}},
    )  # fmt: skip
    assert torch.equal(read.model["w"], torch.ones(2))
    assert read.model_config == {"factory": "pkg:make", "args": {"width": 4}}
    assert read.missing_state() == []


def test_the_file_keeps_the_model_config_on_its_own_for_older_readers() -> None:
    raw = full_payload().to_dict()
    assert raw["model_config"] == {"factory": "pkg:make", "args": {"width": 4}}


def test_a_file_from_before_the_whole_config_was_kept_names_the_model_config() -> None:
    read = schema.read({"step": 2, "model": {}, "model_config": {"factory": "old:make"}})
    assert read.config == {"model": {"factory": "old:make"}}
    assert read.model_config == {"factory": "old:make"}


def test_a_weights_only_file_lacks_the_training_state() -> None:
    read = schema.read({"step": 0, "model": {"w": torch.zeros(1)}})
    assert read.model_config is None
    assert read.missing_state() == ["optimizer", "scheduler", "scaler", "rng"]


def test_digest_is_the_sidecars_and_equals_the_files_own_sha256(tmp_path: Path) -> None:
    import hashlib

    path = files.save(tmp_path, 1, full_payload().to_dict())
    assert files.digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").unlink()
    assert files.digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()


MISFITS = [
    ({"w": torch.zeros(3)}, {"w": torch.zeros(3)}, True, []),
    ({"w": torch.zeros(3)}, {"w": torch.zeros(4)}, True, ["shapes differ: w (4,) vs the model's (3,)"]),
    ({"w": torch.zeros(3), "b": torch.zeros(1)}, {"w": torch.zeros(3)}, True,
     ["missing from the checkpoint: b"]),
    ({"w": torch.zeros(3)}, {"w": torch.zeros(3), "old.w": torch.zeros(1)}, True,
     ["not in the model: old.w"]),
    ({"a": torch.zeros(2, 3), "b": torch.zeros(3)}, {"a": torch.zeros(3, 3), "c": torch.zeros(1)},
     True, ["shapes differ: a (3, 3) vs the model's (2, 3)", "missing from the checkpoint: b",
            "not in the model: c"]),
    ({"w": torch.zeros(3), "b": torch.zeros(1)}, {"w": torch.zeros(3)}, False, []),
    ({"w": torch.zeros(3)}, {"x": torch.zeros(3)}, False,
     ["no tensor of the checkpoint matches the model's names"]),
]  # fmt: skip


@pytest.mark.parametrize(("model", "weights", "strict", "problems"), MISFITS)
def test_weights_that_do_not_fit_the_model_are_named(
    model: dict[str, torch.Tensor],
    weights: dict[str, torch.Tensor],
    strict: bool,
    problems: list[str],
) -> None:
    assert schema.misfits(model, weights, strict=strict) == problems
