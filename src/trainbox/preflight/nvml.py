"""NVML (pynvml, from nvidia-ml-py) before CUDA starts: one survey of the GPUs this process may use.

With health/gpu.py (one GPU's readings during training, through this module's Reader), the only
module that talks to NVML.

CUDA_VISIBLE_DEVICES is applied here the way CUDA (and torch.cuda) reads it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from trainbox.logs import log
from trainbox.preflight.facts import GpuFacts, GpuSurvey, Process

MIB = 1024 * 1024

T = TypeVar("T")

# Leading integer as strtoul reads it: CUDA takes "1gpu2" as 1 and "+3" as 3 (torch models it so).
_ORDINAL = re.compile(r"[+-]?\d+")


def survey(env: Mapping[str, str]) -> GpuSurvey:
    """NVML's view of the GPUs this process may use; driver_error says why there is none."""
    try:
        import pynvml
    except ImportError:
        return GpuSurvey(driver_error="nvidia-ml-py (module pynvml) is not installed")
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as error:
        return GpuSurvey(driver_error=f"NVML could not start: {_describe(error)}")
    try:
        return _survey(pynvml, env.get("CUDA_VISIBLE_DEVICES"))
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def count_visible_gpus(env: Mapping[str, str]) -> int:
    """How many GPUs this process may use; 0 without a driver."""
    return len(survey(env).gpus)


class Reader:
    """Calls pynvml for one GPU under one error policy, remembering the first sign it is lost."""

    def __init__(self, nvml: ModuleType, index: int | None) -> None:
        self._nvml = nvml
        self._index = index
        self._missing = _codes(nvml, "FUNCTION_NOT_FOUND")
        self._unsupported = _codes(nvml, "NOT_SUPPORTED", "NO_PERMISSION")
        self._lost = _codes(nvml, "GPU_IS_LOST", "RESET_REQUIRED", "CORRUPTED_INFOROM")
        # Why the GPU is unusable, from the first call that said so.
        self.lost: str | None = None

    def read(self, what: str, *attempts: Callable[[], T]) -> T | None:
        """The first attempt this binding and driver both have; None when the GPU cannot say."""
        for attempt in attempts:
            try:
                return attempt()
            except AttributeError:
                continue  # an older nvidia-ml-py lacks the function or constant: try the next
            except self._nvml.NVMLError as error:
                code = getattr(error, "value", None)
                if code in self._missing:
                    continue  # the driver's libnvidia-ml predates the function
                if code in self._lost:
                    self.lost = self.lost or f"NVML: {error} (reading {what})"
                elif code not in self._unsupported:
                    log.debug("nvml_read_failed", gpu=self._index, what=what, error=str(error))
                return None
        return None


@dataclass(frozen=True, slots=True)
class _Device:
    """One GPU as NVML enumerates it, before CUDA_VISIBLE_DEVICES is applied."""

    index: int
    handle: Any
    # Empty when NVML could not say (a lost GPU).
    uuid: str
    reader: Reader


@dataclass(frozen=True, slots=True)
class _Choice:
    """A GPU CUDA will show: a whole device, or one MIG instance on it."""

    device: _Device
    mig_handle: Any = None
    mig_uuid: str | None = None


def _survey(nvml: ModuleType, mask: str | None) -> GpuSurvey:
    system = Reader(nvml, None)
    driver = system.read("the driver version", lambda: _text(nvml.nvmlSystemGetDriverVersion()))
    cuda = system.read(
        "the CUDA driver version", lambda: _cuda_version(nvml.nvmlSystemGetCudaDriverVersion())
    )
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as error:
        return GpuSurvey(
            driver_error=f"NVML could not count GPUs: {_describe(error)}",
            driver_version=driver,
            cuda_driver=cuda,
        )
    devices = [_open(nvml, index) for index in range(count)]
    chosen, unmatched = _select(nvml, devices, mask)
    return GpuSurvey(
        driver_version=driver,
        cuda_driver=cuda,
        gpus=tuple(_facts(nvml, choice) for choice in chosen),
        unmatched=unmatched,
    )


def _open(nvml: ModuleType, index: int) -> _Device:
    reader = Reader(nvml, index)
    handle = reader.read("the device handle", lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    uuid = None
    if handle is not None:
        uuid = reader.read("the UUID", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
    return _Device(index=index, handle=handle, uuid=uuid or "", reader=reader)


def _select(
    nvml: ModuleType, devices: list[_Device], mask: str | None
) -> tuple[list[_Choice], tuple[str, ...]]:
    """Apply CUDA_VISIBLE_DEVICES as CUDA does: the first bad entry hides itself and the rest."""
    if mask is None:
        return [_Choice(device) for device in devices], ()
    entries = [entry.strip() for entry in mask.split(",")] if mask.strip() else []
    chosen: list[_Choice] = []
    for entry in entries:
        kind, first = _kind(entry), _kind(entries[0])
        if kind != first:
            # CUDA reads a list of one kind; torch.cuda stops at the first entry of another.
            choice: _Choice | str = f"is {_KINDS[kind][0]} in a list of {_KINDS[first][1]}"
        elif kind == "mig" and chosen:
            choice = "is a second MIG instance, but CUDA uses only the first"
        else:
            choice = _resolve(nvml, devices, entry, kind)
        if isinstance(choice, str):
            return chosen, (f"CUDA_VISIBLE_DEVICES entry {entry!r} {choice}",)
        if any(c.device.index == choice.device.index for c in chosen):
            # torch.cuda mirrors CUDA here: a repeat empties the whole list, not just its tail.
            gpu = f"GPU {choice.device.index}"
            return [], (f"CUDA_VISIBLE_DEVICES entry {entry!r} repeats {gpu}, so CUDA shows none",)
        chosen.append(choice)
    return chosen, ()


_KINDS = {
    "index": ("an index", "indices"),
    "uuid": ("a GPU UUID", "GPU UUIDs"),
    "mig": ("a MIG UUID", "MIG UUIDs"),
}


def _kind(entry: str) -> str:
    if entry.startswith("MIG-"):
        return "mig"
    return "uuid" if entry.startswith("GPU-") else "index"


def _resolve(nvml: ModuleType, devices: list[_Device], entry: str, kind: str) -> _Choice | str:
    """The GPU one entry names, or why it names none."""
    if kind == "mig":
        return _resolve_mig(nvml, devices, entry)
    if kind == "uuid":
        matches = [device for device in devices if device.uuid.startswith(entry)]
        if len(matches) > 1:
            return f"is ambiguous: {len(matches)} GPU UUIDs start with it"
        return _Choice(matches[0]) if matches else _no_gpu(devices)
    ordinal = _ORDINAL.match(entry)
    if ordinal is None:
        return "is neither an index nor a GPU-/MIG- UUID"
    index = int(ordinal.group())
    if index < 0:
        return "is negative"
    return _Choice(devices[index]) if index < len(devices) else _no_gpu(devices)


def _resolve_mig(nvml: ModuleType, devices: list[_Device], entry: str) -> _Choice | str:
    try:
        mig = nvml.nvmlDeviceGetHandleByUUID(entry)
        parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        parent_uuid = _text(nvml.nvmlDeviceGetUUID(parent))
    except AttributeError:
        return "names a MIG instance, which this nvidia-ml-py cannot resolve"
    except nvml.NVMLError as error:
        return f"matches no MIG instance ({error})"
    device = next((device for device in devices if device.uuid == parent_uuid), None)
    if device is None:
        return f"is on GPU {parent_uuid}, which NVML does not list"
    return _Choice(device, mig_handle=mig, mig_uuid=entry)


def _no_gpu(devices: list[_Device]) -> str:
    return f"matches no GPU ({len(devices)} visible to NVML)"


def _facts(nvml: ModuleType, choice: _Choice) -> GpuFacts:
    device, h = choice.device, choice.device.handle
    if h is None:
        return GpuFacts(
            index=device.index, uuid=device.uuid, mig_uuid=choice.mig_uuid, lost=device.reader.lost
        )
    read = device.reader.read
    # A MIG process sees its instance's memory and processes; other instances are not its concern.
    own = h if choice.mig_handle is None else choice.mig_handle
    memory = read("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(own))
    rows = read("remapped rows", lambda: nvml.nvmlDeviceGetRemappedRows(h))
    mig_mode = read("MIG mode", lambda: nvml.nvmlDeviceGetMigMode(h))
    processes = read("processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(own))
    words = -(-(os.cpu_count() or 1) // 64)
    affinity = read(
        "CPU affinity",
        lambda: nvml.nvmlDeviceGetCpuAffinityWithinScope(h, words, nvml.NVML_AFFINITY_SCOPE_NODE),
        lambda: nvml.nvmlDeviceGetCpuAffinity(h, words),
    )
    numa = read("NUMA node", lambda: nvml.nvmlDeviceGetNumaNodeId(h))
    return GpuFacts(
        index=device.index,
        uuid=device.uuid,
        mig_uuid=choice.mig_uuid,
        name=read("the name", lambda: _text(nvml.nvmlDeviceGetName(h))) or "",
        pci_bus_id=read(
            "the PCI bus id", lambda: _sysfs_bus_id(_text(nvml.nvmlDeviceGetPciInfo(h).busId))
        )
        or "",
        memory_total_mib=None if memory is None else memory.total // MIB,
        memory_used_mib=None if memory is None else memory.used // MIB,
        ecc_uncorrected_volatile=read(
            "ECC errors",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        ),
        recovery_action=read("the recovery action", lambda: _recovery_action(nvml, h)),
        remapped_uncorrectable=None if rows is None else rows[1],
        remap_pending=None if rows is None else bool(rows[2]),
        remap_failed=None if rows is None else bool(rows[3]),
        retired_pages_pending=read(
            "retired pages", lambda: bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
        ),
        clock_event_reasons=read(
            "clock event reasons",
            lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        ),
        temperature_c=read(
            "the temperature", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
        ),
        temperature_slowdown_c=read(
            "the slowdown temperature",
            lambda: nvml.nvmlDeviceGetTemperatureThreshold(
                h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
        ),
        pcie_gen=read("the PCIe generation", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        pcie_gen_max=read(
            "the maximum PCIe generation", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)
        ),
        pcie_width=read("the PCIe width", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
        pcie_width_max=read(
            "the maximum PCIe width", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(h)
        ),
        mig_enabled=None if mig_mode is None else mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE,
        compute_mode=read("the compute mode", lambda: nvml.nvmlDeviceGetComputeMode(h)),
        processes=None if processes is None else tuple(_process(p) for p in processes),
        persistence=read(
            "persistence mode",
            lambda: nvml.nvmlDeviceGetPersistenceMode(h) == nvml.NVML_FEATURE_ENABLED,
        ),
        cpu_affinity=None if affinity is None else _cpus(affinity),
        # sysfs and NVML say -1 for "no NUMA node".
        numa_node=None if numa is None or numa < 0 else numa,
        # Last, so every read above has had its chance to find the GPU lost.
        lost=device.reader.lost,
    )


def _recovery_action(nvml: ModuleType, handle: Any) -> int:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; the field's own return code is raised like a call's."""
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    if value.nvmlReturn != nvml.NVML_SUCCESS:
        raise nvml.NVMLError(value.nvmlReturn)
    member = {
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }.get(value.valueType, "uiVal")
    return int(getattr(value.value, member))


def _process(info: Any) -> Process:
    used = info.usedGpuMemory
    return Process(pid=int(info.pid), used_mib=None if used is None else used // MIB)


def _cpus(words: Iterable[int]) -> frozenset[int]:
    """CPU ids from NVML's affinity mask: word 0 holds CPUs 0-63, word 1 CPUs 64-127, ..."""
    return frozenset(
        64 * position + bit
        for position, word in enumerate(words)
        for bit in range(64)
        if int(word) >> bit & 1
    )


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` as sysfs writes it: `0000:3b:00.0`."""
    parts = bus_id.strip().lower().split(":")
    try:
        domain = int(parts[0], 16)
    except ValueError:
        return bus_id.strip().lower()
    return ":".join([f"{domain:04x}", *parts[1:]]) if len(parts) == 3 else bus_id.strip().lower()


def _cuda_version(value: int) -> tuple[int, int]:
    """12080 → (12, 8)."""
    return value // 1000, value % 1000 // 10


def _codes(nvml: ModuleType, *names: str) -> frozenset[int]:
    # Looked up by name so a binding that lacks a newer code still works.
    return frozenset(
        code for name in names if (code := getattr(nvml, f"NVML_ERROR_{name}", None)) is not None
    )


def _describe(error: BaseException) -> str:
    return f"{error} ({type(error).__name__})"


def _text(value: str | bytes) -> str:
    # nvidia-ml-py before 11.515 returns bytes.
    return value.decode() if isinstance(value, bytes) else value
