"""One rank's telemetry: a sampler thread reads its GPU (NVML) and its process (psutil) every
`health.sample_every_s`, keeps the latest sample as a ready LogPointShare, and reports a GPU
gone bad.

The training thread never waits for it: `share()` reads one attribute the sampler swaps.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from trainbox.config import HealthConfig
from trainbox.health.gpu import GpuWatch
from trainbox.health.gpu_errors import Finding
from trainbox.health.logpoint import LogPointShare
from trainbox.health.telemetry_share import REASONS, empty, encode, records
from trainbox.logs import log
from trainbox.preflight.facts import GpuSurvey
from trainbox.preflight.nvml import MIB

# Bits worth a warning when they turn on (NVSentinel#890, DCGM's health watch): the GPU is
# slowed by heat or power trouble, not by being idle or by a clock setting someone chose.
HARMFUL_REASONS = frozenset({"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                             "hw_power_brake_slowdown"})  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """One reading of this rank's GPU and process."""

    # Numbers by metric or peak name (telemetry_share's METRICS and PEAKS); None: not measured.
    values: dict[str, float | None]
    # The GPU's clock event reason bits; None without a GPU reading.
    reasons: int | None
    # The same, encoded for the log point's all-reduce.
    share: LogPointShare


class HostReader:
    """This process's CPU use (since the last read) and resident memory, from psutil."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only starts the clock
        self._broken = False

    def read(self) -> dict[str, float | None]:
        """cpu_percent (100 = one busy core) and rss_mib; nothing once psutil failed."""
        if self._broken:
            return {}
        try:
            cpu = self._process.cpu_percent(None)
            rss = self._process.memory_info().rss / MIB
        except psutil.Error as error:
            self._broken = True
            log.warning("telemetry_field_dropped", field="cpu_percent, rss_mib", error=str(error))
            return {}
        return {"cpu_percent": cpu, "rss_mib": rss}


class Telemetry:
    """The sampler thread of one rank; `on_fault` gets a one-line description of a GPU fault."""

    def __init__(
        self,
        *,
        every_s: float,
        gpu: GpuWatch | None,
        where: str,
        on_fault: Callable[[str], None] | None = None,
    ) -> None:
        self.every_s, self.gpu, self.where, self.on_fault = every_s, gpu, where, on_fault
        self._latest = Sample(values={}, reasons=None, share=empty())
        self._stopping = threading.Event()
        self._throttled: frozenset[str] = frozenset()
        self._host = HostReader()
        self._thread = threading.Thread(target=self._run, name="trainbox-telemetry", daemon=True)

    def start(self) -> None:
        """Start sampling; the first sample comes from the thread, never from the caller."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait for the thread (at most one sample's reads)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.every_s + 5)

    def latest(self) -> Sample:
        """The newest sample (empty before the first)."""
        return self._latest

    def share(self) -> LogPointShare:
        """This rank's part of the log point's all-reduce: the newest sample, encoded."""
        return self._latest.share

    @staticmethod
    def records(whole: LogPointShare, *, step: int) -> list[dict[str, Any]]:
        """The metrics.jsonl records ("gpu", "host") of the job's all-reduced LogPointShare."""
        return records(whole, step=step)

    def open(self) -> None:
        """Start NVML for this rank's GPU (on the sampler's thread; tests call it directly)."""
        if self.gpu is not None and not self.gpu.open():
            self.gpu = None  # NVML cannot watch this GPU: the process alone is sampled

    def sample_once(self) -> Sample:
        """Read, publish and judge one sample; a GPU fault goes to `on_fault`."""
        values, reasons = self.gpu.read() if self.gpu is not None else ({}, None)
        values = {**values, **self._host.read()}
        sample = Sample(values=values, reasons=reasons, share=encode(values, reasons=reasons))
        self._latest = sample  # one store: the training thread reads whole samples only
        self._say_throttling(reasons)
        if self.gpu is not None:
            for finding in self.gpu.findings():
                self._report(finding)
        return sample

    def close(self) -> None:
        """Let go of NVML (on the thread that opened it)."""
        if self.gpu is not None:
            self.gpu.close()

    def _run(self) -> None:
        try:
            self.open()
            while True:
                self.sample_once()
                if self._stopping.wait(self.every_s):
                    return
        except Exception as error:  # telemetry must never take training down with it
            log.warning("telemetry_stopped", error=f"{type(error).__name__}: {error}")
        finally:
            self.close()

    def _report(self, finding: Finding) -> None:
        if finding.level == "ignore":
            log.info("gpu_event_ignored", what=finding.what, gpu=self.where)
        elif finding.level == "warn":
            log.warning("gpu_event", what=finding.what, gpu=self.where)
        else:
            line = f"{self.where}: {finding.what}"
            log.error("gpu_fault", what=finding.what, gpu=self.where)
            if self.on_fault is not None:
                self.on_fault(line)

    def _say_throttling(self, reasons: int | None) -> None:
        """Warn when a harmful clock event reason turns on (once per episode)."""
        active = frozenset(name for name, bit in REASONS if reasons is not None and reasons & bit)
        started = (active & HARMFUL_REASONS) - self._throttled
        if started:
            log.warning("gpu_throttled", reasons=sorted(started), gpu=self.where)
        self._throttled = active & HARMFUL_REASONS


def for_rank(
    config: HealthConfig,
    *,
    survey: GpuSurvey,
    gpu_ordinal: int,
    rank: int,
    on_fault: Callable[[str], None] | None,
) -> Telemetry | None:
    """The sampler for this rank: whenever NVML lists GPUs, the one at `gpu_ordinal` (modulo
    their count) in the survey's CUDA order, else its process alone; None with
    `health.telemetry` off."""
    if not config.telemetry:
        return None
    host = platform.node()
    gpu = None
    where = f"rank {rank} on host {host} (no GPU)"
    if survey.gpus:
        facts = survey.gpus[gpu_ordinal % len(survey.gpus)]
        # XIDs and ECC belong to the whole GPU, also when this rank uses a MIG instance of it.
        gpu = GpuWatch(uuid=facts.uuid, index=facts.index, fatal_xids=frozenset(config.fatal_xids))
        where = f"GPU {facts.index} ({facts.uuid}) on host {host}, rank {rank}"
    return Telemetry(
        every_s=config.sample_every_s,
        gpu=gpu,
        where=where,
        on_fault=on_fault if config.stop_on_gpu_fault else None,
    )
