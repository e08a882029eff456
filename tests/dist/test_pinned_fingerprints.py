"""Today's fingerprints, pinned per processor kind: reworking the trainer must not change the math.

Same config + seed + world size ⇒ the same params_sha256 is the product's promise; a float
summed in another order shows up here first. The runs hold ATen and oneDNN to their AVX2 code
paths and MKL to its AVX2 branch (PORTABLE), so what selects the kernels is the vendor and the
level capped at AVX2: the pins are keyed by that kind (`Processor.capped`), and a machine with
AVX-512 is checked against its vendor's AVX2 values. MKL_CBWR=AVX2 is Intel-only (on other
vendors MKL takes its own branch for the vendor), so AMD CPUs get their own values;
docs/training.md says where the bits part (MKL's GEMM and its vector math) and how that was
measured (scripts/kernel_bits.py).

On a processor kind with no values here the test says so, with this machine's value, instead
of failing: add the kind's entry after checking that two runs of `./scripts/test -rs
tests/dist/test_pinned_fingerprints.py` report the same values. If torch changes on purpose,
re-measure every kind you can and say so in the commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox.affinity import processor

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples"
OPTIONS = ["train.amp=bf16", "train.grad_accum=2", "train.clip_grad_norm=0.5", "optim.name=sgd",
           "optim.lr=0.05", "optim.schedule=constant"]  # fmt: skip
USER_MODEL = ["--config", str(EXAMPLES / "user_model" / "config.yaml")]
# The same code paths on every Intel processor with AVX2 (AVX-512 machines included).
PORTABLE = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# The level PORTABLE holds ATen and oneDNN to: the pins' key caps the machine's level at it.
PORTABLE_LEVEL = "avx2"

# (case id, overrides, processes, PYTHONPATH)
CASES = [
    ("defaults-1", [], 1, None),
    ("defaults-2", [], 2, None),
    ("bf16-accum-clip-sgd-constant", OPTIONS, 1, None),
    ("user-model-example", USER_MODEL, 1, EXAMPLES / "user_model"),
]
INTEL = {
    "defaults-1": "02d8a864a2d39e9d0fdb81057b5b89a2f65bbbbbb193869c123a2c72816ef16d",
    "defaults-2": "499ffdd2bc29ca976a820940a911ae1cb9a008592b0dbcf42dbd589bdc4cc0ca",
    "bf16-accum-clip-sgd-constant": "1c8ac34f3cd66eba2721bd9a5dd974b010ef01792c433a0481046b064e319196",
    "user-model-example": "284461ef79fda07f28f601806f5276412c322fb109942f30d4238d64e9f9b5ed",
}  # fmt: skip
# params_sha256 per processor kind under PORTABLE (Processor.capped(PORTABLE_LEVEL).kind).
FINGERPRINTS = {
    # A 2-vCPU Xeon with AVX-512 (Sapphire Rapids) natively; the same values under qemu's
    # Haswell model (AVX2 only).
    "intel-avx2": INTEL,
    # Two 2-vCPU AMD EPYC machines gave these same values: one reported with AVX2 and FMA and no
    # AVX-512, one with AVX-512 (avx512f, avx512dq, avx512bw). The bf16 case avoids MKL (its
    # GEMMs are torch's own, and SGD takes no square root), so it matches Intel's.
    "amd-avx2": {
        "defaults-1": "7bec5a59f867d56374bd3ec77f134d1a98bc7cb56fa03c8e880ddf468d781900",
        "defaults-2": "8c4211e769be3bbbc6ff03e889ff58a1c7a305d831424f298477ed0db98a1e52",
        "bf16-accum-clip-sgd-constant": INTEL["bf16-accum-clip-sgd-constant"],
        "user-model-example": "b19b96cbdb71cfbdc8a720c68c74e01be2cdc71a1f0607aa39a12d26e6cdba4d",
    },
}


def pinned(case: str, kind: str) -> str | None:
    """The pinned params_sha256 of `case` on processors of `kind`, or None where none is."""
    return FINGERPRINTS.get(kind, {}).get(case)


@pytest.mark.parametrize(
    ("case", "overrides", "nproc", "pythonpath"), CASES, ids=[case[0] for case in CASES]
)
def test_the_fingerprint_is_todays(
    tmp_path: Path, case: str, overrides: list[str], nproc: int, pythonpath: Path | None
) -> None:
    train(tmp_path, *QUICK, *overrides, nproc=nproc, pythonpath=pythonpath, env=PORTABLE)
    got = summary(tmp_path)["params_sha256"]
    cpu = processor.read()
    kind = cpu.capped(PORTABLE_LEVEL).kind
    expected = pinned(case, kind)
    if expected is None:
        pytest.skip(
            f"no fingerprint pinned for processor kind {kind!r} ({cpu.model}, {cpu.kind}): this "
            f"machine gives {got}; to pin it, add FINGERPRINTS[{kind!r}] in {Path(__file__).name}"
        )
    assert got == expected, f"{case} on {cpu.kind} ({cpu.model}), pinned as {kind}"


@pytest.mark.parametrize(
    ("cpuinfo_kind", "pins"),
    [("intel-avx512", "intel-avx2"), ("intel-avx2", "intel-avx2"), ("amd-avx512", "amd-avx2"),
     ("amd-avx2", "amd-avx2")],
)  # fmt: skip
def test_a_machine_is_checked_against_the_pins_of_its_capped_kind(
    cpuinfo_kind: str, pins: str
) -> None:
    vendor, level = cpuinfo_kind.split("-")
    cpu = processor.Processor(vendor=vendor, model="", level=level)
    assert cpu.capped(PORTABLE_LEVEL).kind == pins
    assert pins in FINGERPRINTS


def test_every_kind_pins_every_case() -> None:
    assert [sorted(values) for values in FINGERPRINTS.values()] == [
        sorted(case[0] for case in CASES)
    ] * len(FINGERPRINTS)
