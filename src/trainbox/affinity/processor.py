"""Processor: the CPU's vendor, model and the instruction set its math kernels dispatch on.

On CPU, torch, MKL and oneDNN pick their kernels by vendor and instruction set, and those
kernels add floats in different orders, so a run's `params_sha256` is only comparable between
machines of one kind (docs/training.md, Reproducibility). run.json records it for that reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

# Short names for the vendor_id strings of /proc/cpuinfo.
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon"}
# The levels ATen dispatches on, best first, each with the flags it needs (cpuinfo's rules).
_LEVELS = (
    ("avx512", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"})),
    ("avx2", frozenset({"avx2", "fma"})),
)
# Every level, best first: "baseline" is what any x86-64 CPU runs.
_ORDER = (*(name for name, _ in _LEVELS), "baseline")


@dataclass(frozen=True, kw_only=True, slots=True)
class Processor:
    """What decides which CPU kernels run: who made the CPU and the best level it supports."""

    # The vendor's short name ("intel", "amd"), or vendor_id as it stands; "unknown" if unread.
    vendor: str
    # The model name from /proc/cpuinfo, for people ("AMD EPYC 7B13"); "" if unread.
    model: str
    # The best vector level ATen can use here: "avx512", "avx2" or "baseline".
    level: str

    @property
    def kind(self) -> str:
        """`vendor-level`, e.g. "intel-avx512": machines of one kind run the same kernels."""
        return f"{self.vendor}-{self.level}"

    def capped(self, level: str) -> Processor:
        """This processor with its level held to at most `level`, as ATEN_CPU_CAPABILITY and
        ONEDNN_MAX_CPU_ISA hold the kernels; ValueError for a level that does not exist."""
        if level not in _ORDER:
            raise ValueError(f"{level!r} is not one of {', '.join(_ORDER)}")
        lower = max(_ORDER.index(level), _ORDER.index(self.level))
        return dataclasses.replace(self, level=_ORDER[lower])


def parse(cpuinfo: str) -> Processor:
    """The Processor that /proc/cpuinfo's text describes (its first CPU; they are alike)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    vendor_id = fields.get("vendor_id", "")
    flags = frozenset(fields.get("flags", "").split())
    level = next((name for name, needs in _LEVELS if needs <= flags), "baseline")
    return Processor(
        vendor=_VENDORS.get(vendor_id, vendor_id or "unknown"),
        model=fields.get("model name", ""),
        level=level,
    )


def read(path: Path = Path("/proc/cpuinfo")) -> Processor:
    """This machine's Processor; an unreadable cpuinfo gives the "unknown" kind, never an error."""
    try:
        return parse(path.read_text(errors="replace"))
    except OSError:
        return parse("")
