"""Today's fingerprints, pinned: reworking the trainer must not change what the defaults compute.

Measured on this project's CI machine kind (x86-64, torch 2.13.0 CPU build) before the trainer
was split along its extension points. Same config + seed + world size ⇒ the same params_sha256
is the product's promise; a float summed in another order shows up here first. If torch or the
machine kind changes on purpose, re-measure and say so in the commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples"
OPTIONS = ["train.amp=bf16", "train.grad_accum=2", "train.clip_grad_norm=0.5", "optim.name=sgd",
           "optim.lr=0.05", "optim.schedule=constant"]  # fmt: skip
USER_MODEL = ["--config", str(EXAMPLES / "user_model" / "config.yaml")]

# (case id, overrides, processes, PYTHONPATH, the pinned params_sha256)
PINNED = [
    ("defaults-1", [], 1, None, "061cd6c8d7f9b577dc0fbb739224e0a1d6a30b520c2150df19744513bf63c8ca"),
    ("defaults-2", [], 2, None, "8c4211e769be3bbbc6ff03e889ff58a1c7a305d831424f298477ed0db98a1e52"),
    ("bf16-accum-clip-sgd-constant", OPTIONS, 1, None, "89884e767f9b528412310efc50a65f028a1280136d919b0db7e79a84a3f92b70"),
    ("user-model-example", USER_MODEL, 1, EXAMPLES / "user_model", "cd042faae3b9de5cada6c373ba5f19cf579f739246dbc70570a816ee8ff74c3c"),
]


@pytest.mark.parametrize(
    ("overrides", "nproc", "pythonpath", "sha"),
    [case[1:] for case in PINNED],
    ids=[case[0] for case in PINNED],
)
def test_the_fingerprint_is_todays(
    tmp_path: Path, overrides: list[str], nproc: int, pythonpath: Path | None, sha: str
) -> None:
    train(tmp_path, *QUICK, *overrides, nproc=nproc, pythonpath=pythonpath)
    assert summary(tmp_path)["params_sha256"] == sha
