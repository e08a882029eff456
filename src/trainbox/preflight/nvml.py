"""The only module that talks to NVML (through pynvml from nvidia-ml-py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuInfo:
    """One GPU this process may use, as NVML names it."""

    # NVML index: PCI bus order, which ignores CUDA_VISIBLE_DEVICES.
    index: int
    # Stable identity, `GPU-…`; what CUDA_VISIBLE_DEVICES may also name.
    uuid: str
    # Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    name: str
    # Total device memory in MiB.
    memory_mib: int


@contextmanager
def session() -> Iterator[ModuleType | None]:
    """pynvml, initialised, or None when there is no NVIDIA driver on this host."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def visible_gpus(env: Mapping[str, str]) -> list[GpuInfo]:
    """The GPUs CUDA would show this process, matched to NVML devices by index or UUID."""
    with session() as nvml:
        if nvml is None:
            return []
        gpus = [_info(nvml, index) for index in range(nvml.nvmlDeviceGetCount())]
    return select_visible(gpus, env.get("CUDA_VISIBLE_DEVICES"))


def count_visible_gpus(env: Mapping[str, str]) -> int:
    """How many GPUs this process may use; 0 without a driver."""
    return len(visible_gpus(env))


def select_visible(gpus: list[GpuInfo], mask: str | None) -> list[GpuInfo]:
    """Apply CUDA_VISIBLE_DEVICES (indices or UUID prefixes) as CUDA does: stop at the first miss.

    Indices are read in PCI bus order, which is what CUDA uses under CUDA_DEVICE_ORDER=PCI_BUS_ID.
    """
    if mask is None:
        return gpus
    chosen: list[GpuInfo] = []
    for entry in (item.strip() for item in mask.split(",")):
        match = _lookup(gpus, entry)
        if match is None or match in chosen:
            break  # CUDA ignores everything from the first invalid or repeated entry on
        chosen.append(match)
    return chosen


def _lookup(gpus: list[GpuInfo], entry: str) -> GpuInfo | None:
    if entry.isdigit():
        return next((gpu for gpu in gpus if gpu.index == int(entry)), None)
    if entry.startswith("GPU-") and len(entry) > 4:
        return next((gpu for gpu in gpus if gpu.uuid.startswith(entry)), None)
    return None


def _info(nvml: ModuleType, index: int) -> GpuInfo:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    return GpuInfo(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024),
    )


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes.
    return value.decode() if isinstance(value, bytes) else value
