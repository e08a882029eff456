"""The processor kind run.json records and the pinned fingerprints are keyed by.

The cpuinfo texts are cut from real machines' /proc/cpuinfo (the first CPU's block, flags
shortened to the ones that matter plus a few around them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox.affinity import processor


def cpuinfo(vendor: str, model: str, flags: str) -> str:
    """One CPU's block as the kernel prints it, followed by the next CPU's first lines."""
    return (
        f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 25\nmodel name\t: {model}\n"
        f"flags\t\t: fpu sse sse2 {flags} rdrand\nbogomips\t: 4890.81\n\n"
        f"processor\t: 1\nvendor_id\t: SomethingElse\nflags\t\t: sse\n"
    )


# (case, vendor_id, model name, flags, kind)
CASES = [
    ("sapphire-rapids", "GenuineIntel", "Intel(R) Xeon(R) Processor",
     "avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16", "intel-avx512"),
    ("epyc-milan", "AuthenticAMD", "AMD EPYC 7B13", "avx avx2 fma bmi2 sha_ni", "amd-avx2"),
    ("epyc-genoa", "AuthenticAMD", "AMD EPYC 9B14",
     "avx avx2 fma avx512f avx512dq avx512bw avx512vl", "amd-avx512"),
    ("haswell", "GenuineIntel", "Intel(R) Xeon(R) CPU E5-2680 v3", "avx avx2 fma", "intel-avx2"),
    ("avx512f-only", "GenuineIntel", "Intel(R) Xeon Phi(TM) CPU 7210",
     "avx avx2 fma avx512f avx512cd", "intel-avx2"),
    ("avx2-without-fma", "GenuineIntel", "odd hypervisor", "avx avx2", "intel-baseline"),
    ("other-vendor", "CentaurHauls", "VIA Nano", "sse3", "CentaurHauls-baseline"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("vendor", "model", "flags", "kind"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_kind_is_the_vendor_and_the_best_level_aten_can_use(
    vendor: str, model: str, flags: str, kind: str
) -> None:
    found = processor.parse(cpuinfo(vendor, model, flags))
    assert (found.kind, found.model) == (kind, model)


# (case, the machine's kind, the cap, the kind under the cap)
CAPS = [
    ("amd-avx512-under-avx2", "amd-avx512", "avx2", "amd-avx2"),
    ("intel-avx512-under-avx2", "intel-avx512", "avx2", "intel-avx2"),
    ("a-cap-never-raises-the-level", "intel-avx2", "avx512", "intel-avx2"),
    ("below-the-cap-stays", "intel-baseline", "avx2", "intel-baseline"),
    ("capped-to-baseline", "amd-avx512", "baseline", "amd-baseline"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "cap", "capped"), [c[1:] for c in CAPS], ids=[c[0] for c in CAPS])
def test_a_capped_instruction_set_gives_the_lower_of_the_two_levels(
    kind: str, cap: str, capped: str
) -> None:
    vendor, level = kind.split("-")
    found = processor.Processor(vendor=vendor, model="m", level=level).capped(cap)
    assert (found.kind, found.model) == (capped, "m")


def test_a_cap_that_is_no_level_is_refused() -> None:
    with pytest.raises(ValueError, match="avx3"):
        processor.Processor(vendor="amd", model="", level="avx2").capped("avx3")


def test_only_the_first_cpu_is_read() -> None:
    found = processor.parse(cpuinfo("AuthenticAMD", "AMD EPYC 7B13", "avx2 fma"))
    assert found.vendor == "amd"


def test_an_unreadable_cpuinfo_is_the_unknown_kind(tmp_path: Path) -> None:
    found = processor.read(tmp_path / "missing")
    assert (found.kind, found.model) == ("unknown-baseline", "")
