"""What preflight knows about a node: plain values read from NVML and the OS, judged elsewhere.

A field is None when the driver answered NotSupported (or NoPermission) for it: the check that
needs it then reports `skip`, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Process:
    """A process holding memory on a GPU (host PID: NVML is not PID-namespace aware)."""

    # Host PID.
    pid: int
    # GPU memory it holds, MiB; None when the driver does not say.
    used_mib: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuFacts:
    """One GPU this process may use, in CUDA's order, read through NVML."""

    # NVML index of the physical GPU (PCI bus order).
    index: int
    # `GPU-…` UUID of the physical GPU.
    uuid: str
    # `MIG-…` UUID when CUDA_VISIBLE_DEVICES named a MIG instance, else None.
    mig_uuid: str | None = None
    # Marketing name.
    name: str = ""
    # PCI address as sysfs writes it, e.g. `0000:3b:00.0`.
    pci_bus_id: str = ""
    # Error text when a call said the GPU is lost, needs a reset or has a corrupted inforom.
    lost: str | None = None
    # Total and used device memory, MiB.
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    # Volatile (since driver load) uncorrected ECC errors.
    ecc_uncorrected_volatile: int | None = None
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION value (r570+ drivers); 0 is NVML_GPU_RECOVERY_ACTION_NONE.
    recovery_action: int | None = None
    # nvmlDeviceGetRemappedRows: rows remapped for uncorrectable errors, pending, failure occurred.
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    # nvmlDeviceGetRetiredPagesPendingStatus (pre-Ampere).
    retired_pages_pending: bool | None = None
    # nvmlDeviceGetCurrentClocksEventReasons bitmask.
    clock_event_reasons: int | None = None
    # Core temperature and the slowdown threshold, °C.
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None
    # PCIe link generation and width: current and maximum.
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    # nvmlDeviceGetMigMode current mode (1 enabled, 0 disabled).
    mig_enabled: bool | None = None
    # nvmlDeviceGetComputeMode (0 default, 2 prohibited, 3 exclusive process).
    compute_mode: int | None = None
    # Compute processes already on the GPU.
    processes: tuple[Process, ...] | None = None
    # nvmlDeviceGetPersistenceMode.
    persistence: bool | None = None
    # CPUs near this GPU (nvmlDeviceGetCpuAffinityWithinScope, NUMA-node scope).
    cpu_affinity: frozenset[int] | None = None
    # NUMA node of the GPU.
    numa_node: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSurvey:
    """NVML's view of this host, restricted to the GPUs this process may use."""

    # Why NVML could not start (no driver, library missing, version mismatch); None if it did.
    driver_error: str | None = None
    # nvmlSystemGetDriverVersion, e.g. "570.124.06".
    driver_version: str | None = None
    # nvmlSystemGetCudaDriverVersion as (major, minor), e.g. (12, 8).
    cuda_driver: tuple[int, int] | None = None
    # The visible GPUs in CUDA order (CUDA_VISIBLE_DEVICES applied, matched by index or UUID).
    gpus: tuple[GpuFacts, ...] = ()
    # CUDA_VISIBLE_DEVICES entries that matched no GPU, with the reason.
    unmatched: tuple[str, ...] = ()


def cpu_only(reason: str) -> GpuSurvey:
    """The survey used when GPU checks are off."""
    return GpuSurvey(driver_error=reason)
