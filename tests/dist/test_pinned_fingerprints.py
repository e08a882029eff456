"""Today's fingerprints, pinned: reworking the trainer must not change what the defaults compute.

Same config + seed + world size ⇒ the same params_sha256 is the product's promise; a float
summed in another order shows up here first. The kernels torch picks depend on the processor
(MKL and ATen dispatch on AVX2 or AVX-512), so the pins were first machine-bound: measured on one
CI machine, they failed on the next. They are now measured with MKL, ATen and oneDNN held to
their AVX2 code paths (MKL_CBWR is MKL's own switch for the same results on any processor), so
they hold on any x86-64 machine with AVX2, torch 2.13.0 CPU build. If torch changes on purpose,
re-measure and say so in the commit.
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
# The same code paths on every x86-64 processor with AVX2 (AVX-512 machines included).
PORTABLE = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

# (case id, overrides, processes, PYTHONPATH, the pinned params_sha256)
PINNED = [
    ("defaults-1", [], 1, None, "02d8a864a2d39e9d0fdb81057b5b89a2f65bbbbbb193869c123a2c72816ef16d"),
    ("defaults-2", [], 2, None, "499ffdd2bc29ca976a820940a911ae1cb9a008592b0dbcf42dbd589bdc4cc0ca"),
    (
        "bf16-accum-clip-sgd-constant",
        OPTIONS,
        1,
        None,
        "1c8ac34f3cd66eba2721bd9a5dd974b010ef01792c433a0481046b064e319196",
    ),
    (
        "user-model-example",
        USER_MODEL,
        1,
        EXAMPLES / "user_model",
        "284461ef79fda07f28f601806f5276412c322fb109942f30d4238d64e9f9b5ed",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "nproc", "pythonpath", "sha"),
    [case[1:] for case in PINNED],
    ids=[case[0] for case in PINNED],
)
def test_the_fingerprint_is_todays(
    tmp_path: Path, overrides: list[str], nproc: int, pythonpath: Path | None, sha: str
) -> None:
    train(tmp_path, *QUICK, *overrides, nproc=nproc, pythonpath=pythonpath, env=PORTABLE)
    assert summary(tmp_path)["params_sha256"] == sha
