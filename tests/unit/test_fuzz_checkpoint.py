"""Fuzzed checkpoint files under `trainbox eval`: a result, or one line with a HINT.

Damage comes two ways: bytes (truncated, overwritten, inserted, replaced; the checksum sidecar
kept, removed or made to match), and a well-formed file whose payload has odd values where
the trainer writes a step, weights or a config. Either way eval exits 0 (damage a checksum
cannot see, in tensor data) or 2 with one line, fast, and changes no file.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import event, example, given
from hypothesis import strategies as st

from trainbox import config
from trainbox.checkpoint import files
from trainbox.checkpoint.schema import Payload
from trainbox.config import factories

from fuzzing import assert_refused, error_line, files_under, fuzz, invoke, scratch


@pytest.fixture(scope="module")
def payload() -> dict[str, Any]:
    """A real checkpoint payload of the default task, as the trainer writes it at step 1."""
    settings = config.load(None, [])
    model = factories.build_model(settings.model.factory, settings.model.args)
    return Payload(step=1, model=model.state_dict(), config=config.as_dict(settings)).to_dict()


def saved(data: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


@st.composite
def damaged(draw: st.DrawFn, original: bytes) -> bytes:
    """`original` truncated, overwritten, grown or replaced, as disks and copies do it."""
    kind = draw(st.sampled_from(["truncate", "overwrite", "insert", "replace"]))
    if kind == "replace":
        return draw(st.binary(max_size=300))
    # Half the time near the start, where the zip headers and the pickle live.
    end = draw(st.sampled_from([min(len(original), 4096), len(original)]))
    at = draw(st.integers(min_value=0, max_value=end - 1))
    if kind == "truncate":
        return original[:at]
    chunk = draw(st.binary(min_size=1, max_size=16))
    if kind == "insert":
        return original[:at] + chunk + original[at:]
    return original[:at] + chunk + original[at + len(chunk) :]


def evaluate(folder: Path, data: bytes, sidecar: str) -> None:
    """Write `data` as a checkpoint (sidecar: kept stale, none, or matching), then eval it."""
    path = folder / "step-00000001.pt"
    path.write_bytes(data)
    if sidecar != "none":
        digest = hashlib.sha256(data if sidecar == "matching" else b"the original").hexdigest()
        (folder / "step-00000001.pt.sha256").write_text(f"{digest}  {path.name}\n")
    before = files_under(folder)
    outcome = invoke(["eval", "--checkpoint", str(path)])
    assert files_under(folder) == before
    event(f"exit {outcome.code}")
    if outcome.code == 0:
        assert "Traceback" not in outcome.stderr
        assert outcome.stdout.startswith("evaluated step-00000001.pt")
    else:
        # A refusal costs milliseconds; a whole evaluation well under a second.
        assert_refused(outcome, within_s=10, naming="step-00000001.pt")


@fuzz(40)
@given(data=st.data(), sidecar=st.sampled_from(["stale", "none", "matching"]))
def test_damaged_checkpoint_bytes_give_a_result_or_one_line(
    payload: dict[str, Any], data: st.DataObject, sidecar: str
) -> None:
    with scratch() as folder:
        evaluate(folder, data.draw(damaged(saved(payload))), sidecar)


ODD = st.sampled_from(
    [None, "x", -1, 2**70, 1.5, True, [], [1], {}, {"x": 1}, {"w": "tensor?"}, torch.zeros(2)]
)
FIELDS = ["step", "model", "config", "model_config", "config_hash", "optimizer", "rng",
          "extra_state", "trainbox"]  # fmt: skip


@fuzz(40)
@given(
    changes=st.dictionaries(st.sampled_from(FIELDS), ODD, min_size=1, max_size=3),
    dropped=st.lists(st.sampled_from(FIELDS), max_size=2),
)
@example(changes={"step": [1]}, dropped=[])
@example(changes={"config": 5}, dropped=[])
@example(changes={"config": {}, "model_config": [1]}, dropped=[])
@example(changes={"model": {"w": "tensor?"}}, dropped=[])
def test_odd_payload_values_give_a_result_or_one_line(
    payload: dict[str, Any], changes: dict[str, Any], dropped: list[str]
) -> None:
    data = {k: v for k, v in {**payload, **changes}.items() if k not in dropped}
    with scratch() as folder:
        evaluate(folder, saved(data), "matching")


def test_a_checkpoint_that_loads_is_evaluated(payload: dict[str, Any]) -> None:
    # The properties' exit 0 branch is real: an undamaged file gives a result.
    with scratch() as folder:
        path = files.path_for(folder, 1)
        path.write_bytes(saved(payload))
        outcome = invoke(["eval", "--checkpoint", str(path)])
    assert outcome.code == 0, error_line(outcome)
