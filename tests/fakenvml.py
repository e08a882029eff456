"""A fake `pynvml` module: the real module's constants and error classes, answers from dataclasses."""

# CI has no GPU and no NVIDIA driver, so NVML is simulated at the narrowest boundary, the pynvml
# module itself: code under test imports pynvml as usual, sees real constants, and raises and
# catches the real NVMLError subclasses. Each FakeGpu scripts one GPU, down to which calls fail.

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import sys
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pynvml as real
import pytest

MIB = 1024 * 1024
GIB = 1024 * MIB
H100 = "NVIDIA H100 80GB HBM3"

# Eight H100s of an HGX board; GPUs 2 and 3 share the prefix GPU-8c, for ambiguous-prefix cases.
UUIDS = (
    "GPU-2f4c1a9e-6b7d-4e21-9c3a-5d8e7f601a10",
    "GPU-5a7e3c1b-9d2f-4b6a-8e4c-1f3a5b7c9d21",
    "GPU-8c1d5e7f-3a9b-4c2d-b6e8-9a1c3e5f7b32",
    "GPU-8c9a2b4d-6e1f-4a3c-9b5d-7e2f4a6c8d43",
    "GPU-b3e5a7c9-1d2f-4e6a-a8c1-3b5d7f9e1a54",
    "GPU-d6f8b1a3-5c7e-4d9b-8f2a-4c6e8a1b3d65",
    "GPU-e1a3c5e7-9b2d-4f4a-b6c8-5d7f9b2c4e76",
    "GPU-f4b6d8a2-3c5e-4a7b-9d1f-6e8a2c4b6f87",
)
# NVML's form: 8-digit domain, upper-case hex.
BUS_IDS = tuple(f"00000000:{bus}:00.0" for bus in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"))
# Two sockets of 48 cores, no SMT; GPUs 0-3 hang off socket 0, GPUs 4-7 off socket 1.
SOCKETS = (frozenset(range(48)), frozenset(range(48, 96)))
MIG_UUIDS = (
    "MIG-7b1e3d5f-2a4c-5e6b-8d9f-1a3c5e7b9d02",
    "MIG-9d3f5b7a-4c6e-5a8b-9f1d-3c5e7a9b1d13",
)

# The calls survey may make whose answer a GPU may lack: all_optional_unsupported() fails them.
OPTIONAL_CALLS = (
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetCpuAffinityWithinScope",
    "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
)
# What a data-centre GPU's driver can deliver as events.
EVENT_TYPES = (
    real.nvmlEventTypeXidCriticalError
    | real.nvmlEventTypeDoubleBitEccError
    | real.nvmlEventTypeSingleBitEccError
)


@dataclass(frozen=True, kw_only=True)
class Later:
    """What changes on a GPU once it has been sampled `after` times (utilisation reads).

    Counting samples, not seconds, keeps a scenario the same on a loaded machine: the sampler's
    N-th reading sees the change, whatever the clock did.
    """

    after: int
    # FakeGpu fields and their new values from then on.
    changes: Mapping[str, Any] = field(default_factory=dict)
    # XIDs the driver reports at that moment: delivered by nvmlEventSetWait_v2 to event sets
    # registered for XID events on this GPU (NVML delivers only events after registration).
    xids: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FakeMig:
    """One MIG instance (GPU instance + compute instance) on a FakeGpu."""

    uuid: str
    memory_total: int
    memory_used: int = 0
    # (host PID, bytes used or None) of compute processes on this instance.
    processes: tuple[tuple[int, int | None], ...] = ()


@dataclass(frozen=True, kw_only=True)
class FakeGpu:
    """One GPU; the defaults are a healthy, idle H100 SXM."""

    uuid: str
    # NVML's form, `00000000:3B:00.0`.
    pci_bus_id: str
    name: str = H100
    memory_total: int = 81559 * MIB
    memory_used: int = 0
    ecc_uncorrected_volatile: int = 0
    # None: the driver predates the field (r570), so its nvmlReturn says NOT_SUPPORTED.
    recovery_action: int | None = real.NVML_GPU_RECOVERY_ACTION_NONE
    # (correctable rows, uncorrectable rows, pending, failure occurred).
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    retired_pending: bool = False
    clock_event_reasons: int = real.nvmlClocksEventReasonGpuIdle
    temperature: int = 34
    slowdown_threshold: int = 87
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    mig_mode: int = real.NVML_DEVICE_MIG_DISABLE
    migs: tuple[FakeMig, ...] = ()
    compute_mode: int = real.NVML_COMPUTEMODE_DEFAULT
    # (host PID, bytes used or None) of compute processes on the whole GPU.
    processes: tuple[tuple[int, int | None], ...] = ()
    persistence: bool = True
    cpu_affinity: frozenset[int] = frozenset()
    numa_node: int = 0
    # pynvml function name -> NVML_ERROR_* code that call raises for this GPU.
    errors: Mapping[str, int] = field(default_factory=dict)
    # nvmlDeviceGetUtilizationRates: GPU and memory busy percent.
    utilization: int = 0
    memory_utilization: int = 0
    # nvmlDeviceGetPowerUsage, in milliwatts.
    power_mw: int = 69_000
    # nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM), in MHz.
    sm_clock: int = 345
    # nvmlDeviceGetSupportedEventTypes: the nvmlEventType* bits this GPU can deliver.
    event_types: int = EVENT_TYPES
    # Scripted changes over the GPU's samples, in order of `after`.
    later: tuple[Later, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FakeNode:
    """A host as NVML sees it."""

    gpus: tuple[FakeGpu, ...]
    driver_version: str = "570.124.06"
    cuda_driver_version: int = 12080
    # NVML_ERROR_* code nvmlInit raises (no driver, library missing, version mismatch).
    init_error: int | None = None
    # What os.cpu_count() says while the fake is installed; sizes the affinity mask.
    cpu_count: int = 96
    # Strings come back as bytes, as from nvidia-ml-py releases before 11.515.
    legacy_bytes: bool = False
    # Functions this (older) binding lacks: absent from the module.
    missing: frozenset[str] = frozenset()


def _fail(code: int) -> NoReturn:
    # The real base class picks the subclass (NVMLError_NotSupported, ...) from the code.
    raise real.NVMLError(code)


class _EventSet:
    """An nvmlEventSet_t: which GPUs it watches for which types, and the events waiting."""

    def __init__(self) -> None:
        self.masks: dict[int, int] = {}
        self.pending: list[types.SimpleNamespace] = []
        self.freed = False


class _Handle:
    """Opaque, like NVML's device pointers: code under test can only hand it back."""

    __slots__ = ("gpu", "mig")

    def __init__(self, gpu: int, mig: int | None) -> None:
        self.gpu = gpu
        self.mig = mig

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t gpu={self.gpu} mig={self.mig}>"


@dataclass(frozen=True)
class _Target:
    index: int
    gpu: FakeGpu
    mig: FakeMig | None


def _device(*, mig: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Check init, the handle and the GPU's scripted error, then answer for the _Target."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(self: _Nvml, handle: object, *args: Any) -> Any:
            return method(self, self._target(method.__name__, handle, mig_ok=mig), *args)

        return call

    return wrap


class _Nvml:
    """The state behind one fake module; methods are named exactly as pynvml's functions."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.inits = 0
        self.shutdowns = 0
        self._refs = 0
        # Utilisation reads per GPU: the clock of its Later changes.
        self.samples = [0] * len(node.gpus)
        self.event_sets: list[_EventSet] = []

    def _ready(self) -> None:
        if self._refs == 0:
            _fail(real.NVML_ERROR_UNINITIALIZED)

    def _str(self, text: str) -> str | bytes:
        return text.encode() if self.node.legacy_bytes else text

    def _target(self, name: str, handle: object, *, mig_ok: bool) -> _Target:
        self._ready()
        if not isinstance(handle, _Handle):
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._now(handle.gpu)
        if name in gpu.errors:
            _fail(gpu.errors[name])
        if handle.mig is not None and not mig_ok:
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)  # the fake answers this only for a whole GPU
        return _Target(handle.gpu, gpu, None if handle.mig is None else gpu.migs[handle.mig])

    def _now(self, index: int) -> FakeGpu:
        """GPU `index` as its Later changes have made it so far."""
        gpu = self.node.gpus[index]
        for later in gpu.later:
            if later.after <= self.samples[index]:
                gpu = dataclasses.replace(gpu, **later.changes)
        return dataclasses.replace(gpu, later=self.node.gpus[index].later)

    def _tick(self, index: int) -> None:
        """One more sample of GPU `index`: XIDs scripted for it reach the event sets."""
        self.samples[index] += 1
        for later in self.node.gpus[index].later:
            if later.after != self.samples[index]:
                continue
            for events in self.event_sets:
                if events.masks.get(index, 0) & real.nvmlEventTypeXidCriticalError:
                    events.pending.extend(_xid_event(index, xid) for xid in later.xids)

    def nvmlInit(self) -> None:
        if self.node.init_error is not None:
            _fail(self.node.init_error)
        self.inits += 1
        self._refs += 1

    def nvmlShutdown(self) -> None:
        self._ready()
        self.shutdowns += 1
        self._refs -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._ready()
        return self._str(self.node.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._ready()
        return self.node.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self.node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._ready()
        if not 0 <= index < len(self.node.gpus):
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)
        code = self.node.gpus[index].errors.get("nvmlDeviceGetHandleByIndex")
        if code is not None:
            _fail(code)
        return _Handle(index, None)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._ready()
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, gpu in enumerate(self.node.gpus):
            if gpu.uuid == wanted:
                return _Handle(index, None)
            for position, instance in enumerate(gpu.migs):
                if instance.uuid == wanted:
                    return _Handle(index, position)
        _fail(real.NVML_ERROR_NOT_FOUND)

    @_device(mig=True)
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, t: _Target) -> _Handle:
        if t.mig is None:
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(t.index, None)

    @_device(mig=True)
    def nvmlDeviceGetUUID(self, t: _Target) -> str | bytes:
        return self._str(t.gpu.uuid if t.mig is None else t.mig.uuid)

    @_device()
    def nvmlDeviceGetName(self, t: _Target) -> str | bytes:
        return self._str(t.gpu.name)

    @_device()
    def nvmlDeviceGetPciInfo(self, t: _Target) -> types.SimpleNamespace:
        legacy = t.gpu.pci_bus_id[4:] if len(t.gpu.pci_bus_id) > 12 else t.gpu.pci_bus_id
        return types.SimpleNamespace(
            busId=self._str(t.gpu.pci_bus_id), busIdLegacy=self._str(legacy)
        )

    @_device(mig=True)
    def nvmlDeviceGetMemoryInfo(self, t: _Target, version: int | None = None) -> Any:
        del version  # v2 only adds `reserved`
        total, used = (
            (t.gpu.memory_total, t.gpu.memory_used)
            if t.mig is None
            else (t.mig.memory_total, t.mig.memory_used)
        )
        return real.c_nvmlMemory_t(total=total, free=total - used, used=used)

    @_device()
    def nvmlDeviceGetTotalEccErrors(self, t: _Target, error_type: int, counter_type: int) -> int:
        wanted = (real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, real.NVML_VOLATILE_ECC)
        if (error_type, counter_type) != wanted:
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)  # the only counter the fake keeps
        return t.gpu.ecc_uncorrected_volatile

    @_device()
    def nvmlDeviceGetFieldValues(self, t: _Target, field_ids: list[int]) -> Any:
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId = field_id
            if field_id == real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and (
                t.gpu.recovery_action is not None
            ):
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = t.gpu.recovery_action
                value.nvmlReturn = real.NVML_SUCCESS
            else:
                value.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return values

    @_device()
    def nvmlDeviceGetRemappedRows(self, t: _Target) -> tuple[int, int, int, int]:
        return t.gpu.remapped_rows

    @_device()
    def nvmlDeviceGetRetiredPagesPendingStatus(self, t: _Target) -> int:
        return real.NVML_FEATURE_ENABLED if t.gpu.retired_pending else real.NVML_FEATURE_DISABLED

    @_device()
    def nvmlDeviceGetCurrentClocksEventReasons(self, t: _Target) -> int:
        return t.gpu.clock_event_reasons

    @_device()
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, t: _Target) -> int:
        return t.gpu.clock_event_reasons

    @_device()
    def nvmlDeviceGetTemperature(self, t: _Target, sensor: int) -> int:
        if sensor != real.NVML_TEMPERATURE_GPU:
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)
        return t.gpu.temperature

    @_device()
    def nvmlDeviceGetTemperatureThreshold(self, t: _Target, threshold: int) -> int:
        if threshold != real.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)  # the only threshold the fake keeps
        return t.gpu.slowdown_threshold

    @_device()
    def nvmlDeviceGetCurrPcieLinkGeneration(self, t: _Target) -> int:
        return t.gpu.pcie_gen

    @_device()
    def nvmlDeviceGetMaxPcieLinkGeneration(self, t: _Target) -> int:
        return t.gpu.pcie_gen_max

    @_device()
    def nvmlDeviceGetCurrPcieLinkWidth(self, t: _Target) -> int:
        return t.gpu.pcie_width

    @_device()
    def nvmlDeviceGetMaxPcieLinkWidth(self, t: _Target) -> int:
        return t.gpu.pcie_width_max

    @_device()
    def nvmlDeviceGetMigMode(self, t: _Target) -> list[int]:
        return [t.gpu.mig_mode, t.gpu.mig_mode]

    @_device()
    def nvmlDeviceGetComputeMode(self, t: _Target) -> int:
        return t.gpu.compute_mode

    @_device(mig=True)
    def nvmlDeviceGetComputeRunningProcesses(self, t: _Target) -> list[types.SimpleNamespace]:
        processes = t.gpu.processes if t.mig is None else t.mig.processes
        # pynvml turns NVML_VALUE_NOT_AVAILABLE into None itself.
        return [
            types.SimpleNamespace(
                pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
            for pid, used in processes
        ]

    @_device()
    def nvmlDeviceGetPersistenceMode(self, t: _Target) -> int:
        return real.NVML_FEATURE_ENABLED if t.gpu.persistence else real.NVML_FEATURE_DISABLED

    @_device()
    def nvmlDeviceGetCpuAffinityWithinScope(self, t: _Target, words: int, scope: int) -> Any:
        if scope not in (real.NVML_AFFINITY_SCOPE_NODE, real.NVML_AFFINITY_SCOPE_SOCKET):
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)
        return _mask(t.gpu.cpu_affinity, words)

    @_device()
    def nvmlDeviceGetCpuAffinity(self, t: _Target, words: int) -> Any:
        return _mask(t.gpu.cpu_affinity, words)

    @_device()
    def nvmlDeviceGetNumaNodeId(self, t: _Target) -> int:
        return t.gpu.numa_node

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
        # The sampler's clock: only telemetry reads utilisation (the survey does not).
        if isinstance(handle, _Handle) and self._refs:
            self._tick(handle.gpu)
        t = self._target("nvmlDeviceGetUtilizationRates", handle, mig_ok=False)
        return real.c_nvmlUtilization_t(gpu=t.gpu.utilization, memory=t.gpu.memory_utilization)

    @_device()
    def nvmlDeviceGetPowerUsage(self, t: _Target) -> int:
        return t.gpu.power_mw

    @_device()
    def nvmlDeviceGetClockInfo(self, t: _Target, clock_type: int) -> int:
        if clock_type != real.NVML_CLOCK_SM:
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)  # the only clock the fake keeps
        return t.gpu.sm_clock

    @_device()
    def nvmlDeviceGetSupportedEventTypes(self, t: _Target) -> int:
        return t.gpu.event_types

    def nvmlEventSetCreate(self) -> _EventSet:
        self._ready()
        events = _EventSet()
        self.event_sets.append(events)
        return events

    @_device()
    def nvmlDeviceRegisterEvents(self, t: _Target, mask: int, events: _EventSet) -> None:
        if mask & ~t.gpu.event_types:
            _fail(real.NVML_ERROR_NOT_SUPPORTED)  # as NVML answers for a type it cannot deliver
        events.masks[t.index] = events.masks.get(t.index, 0) | mask

    def nvmlEventSetWait_v2(self, events: _EventSet, timeout_ms: int) -> types.SimpleNamespace:
        self._ready()
        if events.freed:
            _fail(real.NVML_ERROR_INVALID_ARGUMENT)
        if events.pending:
            return events.pending.pop(0)
        time.sleep(timeout_ms / 1000)  # NVML blocks for the whole timeout when nothing comes
        _fail(real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, events: _EventSet) -> None:
        self._ready()
        events.freed = True
        self.event_sets.remove(events)


def _xid_event(index: int, xid: int) -> types.SimpleNamespace:
    """nvmlEventData_t of an XID: eventData is the XID; no MIG instance (0xFFFFFFFF)."""
    return types.SimpleNamespace(
        device=_Handle(index, None),
        eventType=real.nvmlEventTypeXidCriticalError,
        eventData=xid,
        gpuInstanceId=0xFFFFFFFF,
        computeInstanceId=0xFFFFFFFF,
    )


def _mask(cpus: frozenset[int], words: int) -> Any:
    """NVML's affinity answer: `words` 64-bit words, CPUs past the array silently dropped."""
    array = (ctypes.c_ulonglong * words)()
    for cpu in cpus:
        if cpu < 64 * words:
            array[cpu // 64] |= 1 << (cpu % 64)
    return array


# Every function the fake implements; each is a real pynvml name.
FUNCTIONS = tuple(name for name in vars(_Nvml) if name.startswith("nvml"))
# Per-GPU functions: lost_gpu() fails all of them.
DEVICE_CALLS = tuple(name for name in FUNCTIONS if name.startswith("nvmlDevice"))


def fake_pynvml(node: FakeNode) -> types.ModuleType:
    """A module standing in for pynvml on `node`; its `fake` attribute counts inits and shutdowns."""
    module = types.ModuleType("pynvml", "Fake pynvml from tests/fakenvml.py.")
    for name, value in vars(real).items():
        if name.startswith("c_nvml"):
            setattr(module, name, value)  # ctypes structs, for code that builds its own
        constant = name.startswith("NVML_") or (
            name.startswith("nvml")
            and ("Reason" in name or name.startswith("nvmlEventType"))
            and isinstance(value, int)
        )
        if constant or name.startswith("NVMLError"):
            setattr(module, name, value)
    fake = _Nvml(node)
    for name in FUNCTIONS:
        if name not in node.missing:
            setattr(module, name, getattr(fake, name))
    module.fake = fake  # type: ignore[attr-defined]
    return module


def install(monkeypatch: pytest.MonkeyPatch, node: FakeNode) -> types.ModuleType:
    """Make `import pynvml` give the fake for `node`, and os.cpu_count() its CPU count."""
    module = fake_pynvml(node)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(os, "cpu_count", lambda: node.cpu_count)
    return module


def change_gpu(node: FakeNode, index: int, **changes: Any) -> FakeNode:
    """`node` with the FakeGpu at `index` changed."""
    gpus = list(node.gpus)
    gpus[index] = dataclasses.replace(gpus[index], **changes)
    return dataclasses.replace(node, gpus=tuple(gpus))


def with_errors(node: FakeNode, index: int, errors: Mapping[str, int]) -> FakeNode:
    """`node` with GPU `index` also failing the calls in `errors` (function name -> code)."""
    return change_gpu(node, index, errors={**node.gpus[index].errors, **errors})


def _h100(index: int) -> FakeGpu:
    return FakeGpu(
        uuid=UUIDS[index],
        pci_bus_id=BUS_IDS[index],
        cpu_affinity=SOCKETS[index // 4],
        numa_node=index // 4,
        # Hopper retires no pages (row remapping replaced it): NVML says NotSupported.
        errors={"nvmlDeviceGetRetiredPagesPendingStatus": real.NVML_ERROR_NOT_SUPPORTED},
    )


def healthy_node() -> FakeNode:
    """8x H100 80GB HBM3, PCIe gen 5 x16, persistence on; GPUs 0-3 on NUMA 0, 4-7 on NUMA 1."""
    return FakeNode(gpus=tuple(_h100(index) for index in range(8)))


def ecc_uncorrectable() -> FakeNode:
    """GPU 3 has 2 volatile uncorrected ECC errors."""
    return change_gpu(healthy_node(), 3, ecc_uncorrected_volatile=2)


def row_remap_failure() -> FakeNode:
    """GPU 5 failed to remap a row and has a remap pending."""
    return change_gpu(healthy_node(), 5, remapped_rows=(1, 4, 1, 1))


def mig_instances() -> FakeNode:
    """GPU 0 is in MIG mode with two 3g.40gb instances."""
    return change_gpu(
        healthy_node(),
        0,
        mig_mode=real.NVML_DEVICE_MIG_ENABLE,
        migs=tuple(FakeMig(uuid=uuid, memory_total=40192 * MIB) for uuid in MIG_UUIDS),
    )


def pcie_x4() -> FakeNode:
    """GPU 2 trained its PCIe link at x4 of x16."""
    return change_gpu(healthy_node(), 2, pcie_width=4)


def busy_gpu() -> FakeNode:
    """GPU 1 has another process (host PID 4242) holding 30 GiB."""
    return change_gpu(
        healthy_node(), 1, memory_used=30 * GIB + 512 * MIB, processes=((4242, 30 * GIB),)
    )


def no_driver() -> FakeNode:
    """No libnvidia-ml on the host: nvmlInit raises NVMLError_LibraryNotFound."""
    return FakeNode(gpus=(), init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)


def all_optional_unsupported() -> FakeNode:
    """Every GPU answers NotSupported to every optional call (a consumer or virtual GPU)."""
    node = healthy_node()
    unsupported = dict.fromkeys(OPTIONAL_CALLS, real.NVML_ERROR_NOT_SUPPORTED)
    for index in range(len(node.gpus)):
        node = with_errors(node, index, unsupported)
    return node


def lost_gpu() -> FakeNode:
    """GPU 6 fell off the bus: every call about it, even getting its handle, says GPU_IS_LOST."""
    return with_errors(healthy_node(), 6, dict.fromkeys(DEVICE_CALLS, real.NVML_ERROR_GPU_IS_LOST))


def recovery_reset() -> FakeNode:
    """GPU 4's driver asks for a GPU reset (NVML_GPU_RECOVERY_ACTION_GPU_RESET)."""
    return change_gpu(healthy_node(), 4, recovery_action=real.NVML_GPU_RECOVERY_ACTION_GPU_RESET)


def thermal_throttle() -> FakeNode:
    """GPU 7 sits at its slowdown temperature with HW thermal slowdown active."""
    return change_gpu(
        healthy_node(),
        7,
        temperature=87,
        clock_event_reasons=real.nvmlClocksEventReasonHwThermalSlowdown,
    )


def training(gpu: int, *laters: Later) -> FakeNode:
    """A node whose GPUs are busy training (97 %, 550 W, 1980 MHz), GPU `gpu` scripted."""
    node = healthy_node()
    busy = {"utilization": 97, "memory_utilization": 41, "power_mw": 550_000, "sm_clock": 1980,
            "clock_event_reasons": real.nvmlClocksEventReasonNone, "temperature": 61,
            "memory_used": 52 * GIB}  # fmt: skip
    for index in range(len(node.gpus)):
        node = change_gpu(node, index, **busy)
    return change_gpu(node, gpu, later=laters)


def throttles_in_training() -> FakeNode:
    """GPU 1 overheats from its 2nd sample on: HW thermal slowdown, 89 C, SM clock at 1410."""
    hot = {"clock_event_reasons": real.nvmlClocksEventReasonHwThermalSlowdown, "temperature": 89,
           "sm_clock": 1410}  # fmt: skip
    return training(1, Later(after=2, changes=hot))


def ecc_rises_in_training() -> FakeNode:
    """GPU 1's volatile uncorrected ECC count goes from 0 to 1 at its 3rd sample."""
    return training(1, Later(after=3, changes={"ecc_uncorrected_volatile": 1}))


def xid79_in_training() -> FakeNode:
    """GPU 1 falls off the bus at its 3rd sample: the driver reports XID 79."""
    return training(1, Later(after=3, xids=(79,)))


def throttles_and_xid13_in_training() -> FakeNode:
    """GPU 1: XID 13 at its 1st sample, thermal throttling from its 2nd: neither is a fault."""
    node = throttles_in_training()
    return change_gpu(node, 1, later=(Later(after=1, xids=(13,)), *node.gpus[1].later))


def no_events_in_training() -> FakeNode:
    """Busy GPUs whose driver refuses event registration (NOT_SUPPORTED, as older drivers do)."""
    node = training(1)
    for index in range(len(node.gpus)):
        node = with_errors(node, index, {"nvmlDeviceRegisterEvents": real.NVML_ERROR_NOT_SUPPORTED})
    return node
