"""NVML during training: one GPU's readings and its XID events, on the sampler's thread only.

With preflight/nvml.py (the survey before CUDA starts), the only modules that talk to NVML; it
reads through the survey's Reader, so a call the driver lacks or refuses is None, never a crash.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainbox.health.gpu_errors import DOUBLE_BIT_ECC, XID_CRITICAL, Finding, grade_ecc, grade_event
from trainbox.logs import log
from trainbox.preflight.nvml import MIB, Reader

# How long one nvmlEventSetWait_v2 waits for an event: short, the sampler's period paces it.
WAIT_MS = 100
# Events taken per sample at most, so a storm of them cannot starve the readings.
MAX_EVENTS = 16


class GpuWatch:
    """Readings and graded events of the GPU with `uuid` (NVML index `index`, for messages)."""

    def __init__(self, *, uuid: str, index: int, fatal_xids: frozenset[int]) -> None:
        self.uuid, self.index, self.fatal_xids = uuid, index, fatal_xids
        self._nvml: ModuleType | None = None
        self._reader: Reader | None = None
        self._handle: Any = None
        self._events: Any = None
        # Fields a call could not give: warned about once and no longer read.
        self._dropped: set[str] = set()
        # The volatile uncorrected ECC count when the watch started.
        self._baseline: int | None = None
        self._ecc: int | None = None
        self._lost_said = False

    def open(self) -> bool:
        """Start NVML, find the GPU by UUID, arm the XID watch; False when NVML cannot."""
        try:
            import pynvml
        except ImportError:
            log.warning("telemetry_without_nvml", gpu=self.index, error="pynvml is not installed")
            return False
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as error:
            log.warning("telemetry_without_nvml", gpu=self.index, error=str(error))
            return False
        self._nvml, self._reader = pynvml, Reader(pynvml, self.index)
        self._handle = self._reader.read(
            "the device handle", lambda: pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
        )
        if self._handle is None:
            log.warning("telemetry_without_nvml", gpu=self.index, error="no handle for its UUID")
            self.close()
            return False
        self._baseline = self._read_ecc()
        self._arm_events(pynvml)
        return True

    def read(self) -> tuple[dict[str, float | None], int | None]:
        """This GPU's numbers now, by metric name, and its clock event reason bits."""
        nvml, h = self._nvml, self._handle
        if nvml is None or self._reader is None or self._reader.lost:
            return {}, None
        util = self._field("util", lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        memory = self._field("mem_used_mib", lambda: nvml.nvmlDeviceGetMemoryInfo(h).used / MIB)
        power = self._field("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000)
        temp = self._field(
            "temp_c", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
        )
        clock = self._field(
            "sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
        )
        reasons = self._field(
            "clock_event_reasons",
            lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        )
        self._ecc = self._read_ecc()
        values = {
            "util": util,
            "mem_used_mib": memory,
            "power_w": power,
            "temp_c": temp,
            "sm_clock_mhz": clock,
            "ecc_uncorrected": self._ecc,
        }
        return values, None if reasons is None else int(reasons)

    def findings(self) -> list[Finding]:
        """What went wrong since the last call: a lost GPU, an ECC rise, XID events."""
        found = []
        if self._reader is not None and self._reader.lost and not self._lost_said:
            self._lost_said = True
            found.append(Finding(level="fatal", what=f"the GPU is lost ({self._reader.lost})"))
        ecc = grade_ecc(self._baseline, self._ecc)
        if ecc is not None:
            found.append(ecc)
            self._baseline = self._ecc  # said once per rise
        return found + self._drain()

    def close(self) -> None:
        """Free the event set and shut NVML down (on the thread that opened them)."""
        nvml = self._nvml
        if nvml is None:
            return
        if self._events is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
        self._nvml = None

    def _field(self, name: str, *attempts: Callable[[], Any]) -> Any:
        """One reading; the first time a call cannot give it, warn once and drop the field."""
        if name in self._dropped or self._reader is None:
            return None
        value = self._reader.read(name, *attempts)
        if value is None and not self._reader.lost:  # a lost GPU is a fault, said as one
            self._dropped.add(name)
            log.warning("telemetry_field_dropped", gpu=self.index, field=name)
        return value

    def _read_ecc(self) -> int | None:
        nvml, h = self._nvml, self._handle
        assert nvml is not None  # only called once open() has NVML
        value = self._field(
            "ecc_uncorrected",
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        )
        return None if value is None else int(value)

    def _arm_events(self, nvml: ModuleType) -> None:
        """Register for XID and double-bit ECC events; without support, say once and go on."""
        assert self._reader is not None
        h = self._handle
        supported = self._reader.read(
            "supported events", lambda: nvml.nvmlDeviceGetSupportedEventTypes(h)
        )
        mask = (XID_CRITICAL | DOUBLE_BIT_ECC) & int(supported or 0)
        if not mask:
            log.info("xid_watch_unsupported", gpu=self.index)
            return
        try:
            events = nvml.nvmlEventSetCreate()
        except (AttributeError, nvml.NVMLError) as error:
            log.info("xid_watch_unsupported", gpu=self.index, error=str(error))
            return
        try:
            nvml.nvmlDeviceRegisterEvents(h, mask, events)
        except (AttributeError, nvml.NVMLError) as error:
            # NOT_SUPPORTED: a driver or GPU too old for events (the device plugin's case).
            log.info("xid_watch_unsupported", gpu=self.index, error=str(error))
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(events)
            return
        self._events = events

    def _drain(self) -> list[Finding]:
        """Events waiting in the set, graded; a short wait when none is there."""
        nvml, events = self._nvml, self._events
        if nvml is None or events is None:
            return []
        found = []
        for _ in range(MAX_EVENTS):
            try:
                event = nvml.nvmlEventSetWait_v2(events, WAIT_MS)
            except nvml.NVMLError as error:
                if getattr(error, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                    log.warning("xid_watch_failed", gpu=self.index, error=str(error))
                    with contextlib.suppress(nvml.NVMLError):
                        nvml.nvmlEventSetFree(events)
                    self._events = None
                break
            found.append(
                grade_event(int(event.eventType), int(event.eventData), fatal_xids=self.fatal_xids)
            )
        return found
