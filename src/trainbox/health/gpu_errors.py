"""Which GPU events during training mean the GPU went bad: a pure grading of XIDs and ECC counts.

The grading follows DCGM's health watch (DcgmHealthWatch.cpp BuildXidMappings): 48 (double-bit
ECC), 64 (row-remap failure), 74 (NVLink), 79 (fallen off the bus), 95 (uncontained ECC), 119
and 120 (GSP) and 140 (unrecovered ECC) are fatal; 94 (contained ECC) and the rest warn. The
NVIDIA device plugin's application XIDs (13, 31, 43, 45, 68, 109: a kernel's own fault, which
the process sees as a CUDA error anyway) are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FATAL_XIDS = (48, 64, 74, 79, 95, 119, 120, 140)
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# NVML event type bits (pynvml nvmlEventType*).
XID_CRITICAL = 0x8
DOUBLE_BIT_ECC = 0x2

# What the fatal ones (and 94) mean, for the error line (NVIDIA's XID catalogue).
XID_NAMES = {
    48: "double-bit ECC error",
    64: "row-remap failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

Level = Literal["fatal", "warn", "ignore"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One thing seen on the GPU, graded."""

    # fatal: stop the run; warn: log it; ignore: an application's own fault.
    level: Level
    # What happened, in a few words ("XID 79").
    what: str


def grade_event(event_type: int, data: int, *, fatal_xids: frozenset[int]) -> Finding:
    """An NVML event (type bits, XID number for an XID event) graded."""
    if event_type & DOUBLE_BIT_ECC:
        return Finding(level="fatal", what="a double-bit ECC error event")
    if data in APPLICATION_XIDS:
        return Finding(level="ignore", what=f"XID {data} (an application fault)")
    name = XID_NAMES.get(data)
    what = f"XID {data}" + (f" ({name})" if name else "")
    return Finding(level="fatal" if data in fatal_xids else "warn", what=what)


def grade_ecc(baseline: int | None, now: int | None) -> Finding | None:
    """A rise of the volatile uncorrected ECC count since training started is fatal."""
    if baseline is None or now is None or now <= baseline:
        return None
    return Finding(
        level="fatal", what=f"volatile uncorrected ECC errors rose from {baseline} to {now}"
    )
