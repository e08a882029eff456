"""Hold `trainbox doctor --json` against `nvidia-smi -q -x` and sysfs: the GPU proof's first stage.

Pure functions on text, so a test can feed them a recorded nvidia-smi report. Tag names follow
nvidia-smi's XML schema (nvsmi_device_v12.dtd); older drivers spell a few of them differently,
so each fact is looked up under every name it has had.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class SmiGpu:
    """One GPU as nvidia-smi reports it; None where the report says N/A or lacks the field."""

    # `GPU-…` UUID.
    uuid: str
    # PCI address in sysfs form, e.g. `0000:18:00.0`.
    pci_bus_id: str
    # Marketing name.
    name: str
    # Volatile uncorrectable ECC errors (DRAM and SRAM together), None with ECC off.
    ecc_uncorrected_volatile: int | None
    # Whether ECC is on now.
    ecc_enabled: bool | None
    # Rows remapped for uncorrectable errors; a remap pending; a remap that failed.
    remapped_uncorrectable: int | None
    remap_pending: bool | None
    remap_failed: bool | None
    # The GPU's NUMA node, where nvidia-smi reports one.
    numa_node: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class SmiReport:
    """What `nvidia-smi -q -x` says about the node."""

    # e.g. "580.159.04".
    driver_version: str
    # The CUDA version the driver supports, e.g. "13.0".
    cuda_version: str
    # Every GPU, in nvidia-smi's (PCI) order.
    gpus: tuple[SmiGpu, ...]


def parse(xml_text: str) -> SmiReport:
    """The facts doctor reports, read from `nvidia-smi -q -x` output."""
    root = ET.fromstring(xml_text)
    return SmiReport(
        driver_version=_text(root, "driver_version") or "",
        cuda_version=_text(root, "cuda_version") or "",
        gpus=tuple(_gpu(gpu) for gpu in root.iter("gpu")),
    )


def _gpu(gpu: ET.Element) -> SmiGpu:
    volatile = gpu.find("ecc_errors/volatile")
    uncorrected = None
    if volatile is not None:
        # r535+ split DRAM and SRAM; older drivers give double_bit/total.
        counts = [_int(volatile, name) for name in ("dram_uncorrectable", "sram_uncorrectable")]
        known = [count for count in counts if count is not None]
        uncorrected = sum(known) if known else _int(volatile, "double_bit/total")
    return SmiGpu(
        uuid=_text(gpu, "uuid") or "",
        pci_bus_id=sysfs_bus_id(_text(gpu, "pci/pci_bus_id") or gpu.get("id", "")),
        name=_text(gpu, "product_name") or "",
        ecc_uncorrected_volatile=uncorrected,
        ecc_enabled=_flag(_text(gpu, "ecc_mode/current_ecc"), yes="Enabled", no="Disabled"),
        remapped_uncorrectable=_int(gpu, "remapped_rows/remapped_row_unc"),
        remap_pending=_flag(_text(gpu, "remapped_rows/remapped_row_pending"), yes="Yes", no="No"),
        remap_failed=_flag(_text(gpu, "remapped_rows/remapped_row_failure"), yes="Yes", no="No"),
        numa_node=_int(gpu, "numa_id") if gpu.find("numa_id") is not None else None,
    )


def sysfs_bus_id(bus_id: str) -> str:
    """`00000000:18:00.0` (NVML, nvidia-smi) as sysfs writes it: `0000:18:00.0`, lower case."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower() if rest else bus_id.lower()


def compare(
    doctor: Mapping[str, Any], smi: SmiReport, sysfs_cpus: Mapping[str, str]
) -> list[dict[str, Any]]:
    """One row per fact: what doctor said, what nvidia-smi (or sysfs) said, and whether they agree.

    `sysfs_cpus` maps a PCI bus id to /sys/bus/pci/devices/ID/local_cpulist, the CPUs the
    kernel calls near the GPU (what `nvidia-smi topo -m` prints as CPU Affinity).
    """
    driver = doctor.get("driver") or {}
    rows = [
        _row("driver version", None, driver.get("version"), smi.driver_version),
        _row("CUDA version", None, driver.get("cuda"), smi.cuda_version),
        _row("GPU count", None, len(doctor.get("gpus", [])), len(smi.gpus)),
    ]
    by_uuid = {gpu.uuid: gpu for gpu in smi.gpus}
    for gpu in doctor.get("gpus", []):
        seen = by_uuid.get(gpu["uuid"])
        rows.append(_row("UUID", gpu["uuid"], gpu["uuid"], seen.uuid if seen else None))
        if seen is not None:
            rows.extend(_gpu_rows(gpu, seen, sysfs_cpus))
    rows.extend(_verdict_rows(doctor, smi))
    return rows


def _gpu_rows(
    gpu: Mapping[str, Any], seen: SmiGpu, sysfs_cpus: Mapping[str, str]
) -> list[dict[str, Any]]:
    uuid = gpu["uuid"]
    rows = [
        _row("PCI bus id", uuid, gpu.get("pci_bus_id"), seen.pci_bus_id),
        _row("name", uuid, gpu.get("name"), seen.name),
    ]
    for key in ("ecc_uncorrected_volatile", "remapped_uncorrectable", "remap_pending",
                "remap_failed"):  # fmt: skip
        rows.append(_row(key, uuid, gpu.get(key), getattr(seen, key), optional=True))
    if seen.numa_node is not None:
        rows.append(_row("NUMA node", uuid, gpu.get("numa_node"), seen.numa_node))
    near = sysfs_cpus.get(seen.pci_bus_id)
    if near is not None:
        rows.append(_row("CPU affinity (sysfs local_cpulist)", uuid, gpu.get("cpu_affinity"),
                         near, optional=True))  # fmt: skip
    return rows


def _verdict_rows(doctor: Mapping[str, Any], smi: SmiReport) -> list[dict[str, Any]]:
    """preflight's ecc and row_remap verdicts against what nvidia-smi's counts imply."""
    status = {check["name"]: check["status"] for check in doctor.get("checks", [])}
    ecc_bad = any((gpu.ecc_uncorrected_volatile or 0) > 0 for gpu in smi.gpus)
    remap_bad = any(gpu.remap_pending or gpu.remap_failed for gpu in smi.gpus)
    return [
        _row("verdict ecc", None, status.get("ecc"), "fail" if ecc_bad else "ok", same=_passes),
        _row(
            "verdict row_remap",
            None,
            status.get("row_remap"),
            "fail" if remap_bad else "ok",
            same=_passes,
        ),
    ]


def _passes(doctor: Any, expected: Any) -> bool:
    """A check that NVML could not answer is `skip`, which agrees with a healthy GPU."""
    return doctor == expected or (expected == "ok" and doctor == "skip")


def _row(
    what: str,
    gpu: str | None,
    doctor: Any,
    smi: Any,
    *,
    optional: bool = False,
    same: Any = None,
) -> dict[str, Any]:
    """A comparison; `optional` facts that one side does not know are reported, not failed."""
    if optional and (doctor is None or smi is None):
        agree: bool | None = None
    else:
        agree = (same or (lambda a, b: a == b))(doctor, smi)
    return {"what": what, "gpu": gpu, "doctor": doctor, "nvidia_smi": smi, "agree": agree}


def disagreements(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows where doctor and nvidia-smi say different things."""
    return [row for row in rows if row["agree"] is False]


def _text(node: ET.Element, path: str) -> str | None:
    found = node.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text in ("", "N/A", "Not Supported", "Unknown Error") else text


def _int(node: ET.Element, path: str) -> int | None:
    text = _text(node, path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _flag(text: str | None, *, yes: str, no: str) -> bool | None:
    return {yes: True, no: False}.get(text or "")
