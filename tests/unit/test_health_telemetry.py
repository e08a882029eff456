"""One rank's telemetry on a simulated GPU: what a sample reads, what a call NVML refuses does to
it, and which events are a GPU fault. The sampler is driven by hand (open, sample_once), so
every test is exact about how many samples happened; one test runs the real thread."""

from __future__ import annotations

import platform
import threading
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest
import structlog

from trainbox.config import HealthConfig
from trainbox.errors import PreflightError, Stopped
from trainbox.health import for_rank, gpu, telemetry_share
from trainbox.health.gpu_errors import FATAL_XIDS, grade_ecc, grade_event
from trainbox.health.telemetry import Telemetry
from trainbox.preflight import nvml
from trainbox.preflight.facts import GpuSurvey
from trainbox.process import preempt
from trainbox.runtime.trainer import stop_error
from trainbox.train.loop import StoppedEarly

import fakenvml
from fakenvml import UUIDS, FakeNode, Later, install, with_errors

XID = pynvml.nvmlEventTypeXidCriticalError
FATAL = frozenset(FATAL_XIDS)


def telemetry(
    monkeypatch: pytest.MonkeyPatch,
    node: FakeNode,
    *,
    ordinal: int = 1,
    config: HealthConfig | None = None,
) -> tuple[Telemetry, list[str]]:
    """The sampler of the rank on GPU `ordinal` of `node`, opened here; faults land in the list."""
    install(monkeypatch, node)
    # The fake sleeps out an event wait's timeout as NVML does; a short one keeps tests quick.
    monkeypatch.setattr(gpu, "WAIT_MS", 1)
    faults: list[str] = []
    made = for_rank(
        config or HealthConfig(),
        survey=nvml.survey({}),
        gpu_ordinal=ordinal,
        rank=ordinal,
        on_fault=faults.append,
    )
    assert made is not None
    made.open()
    return made, faults


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


def events(captured: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in captured if entry["event"] == name]


def test_a_sample_reads_every_field_of_the_ranks_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, _ = telemetry(monkeypatch, fakenvml.throttles_in_training())
    sample = sampler.sample_once()
    read = {k: v for k, v in sample.values.items() if k not in ("cpu_percent", "rss_mib")}
    assert read == {
        "util": 97,
        "mem_used_mib": 52 * 1024,
        "power_w": 550,
        "temp_c": 61,
        "sm_clock_mhz": 1980,
        "ecc_uncorrected": 0,
    }
    assert sample.reasons == pynvml.nvmlClocksEventReasonNone
    assert sample.values["rss_mib"] > 0
    assert sampler.share() == sample.share


def test_the_rank_samples_its_own_gpu_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, _ = telemetry(monkeypatch, fakenvml.throttles_in_training(), ordinal=3)
    sampler.sample_once()
    assert fakenvml_module().fake.samples == [0, 0, 0, 1, 0, 0, 0, 0]
    assert sampler.where == f"GPU 3 ({UUIDS[3]}) on host {platform.node()}, rank 3"


def fakenvml_module() -> Any:
    import sys

    return sys.modules["pynvml"]


# (the pynvml call refused, the field it drops)
REFUSED = [
    ("nvmlDeviceGetUtilizationRates", "util"),
    ("nvmlDeviceGetMemoryInfo", "mem_used_mib"),
    ("nvmlDeviceGetPowerUsage", "power_w"),
    ("nvmlDeviceGetTemperature", "temp_c"),
    ("nvmlDeviceGetClockInfo", "sm_clock_mhz"),
    ("nvmlDeviceGetTotalEccErrors", "ecc_uncorrected"),
]


@pytest.mark.parametrize(("call", "field"), REFUSED)
@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION])
def test_a_refused_call_drops_its_field_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, logs: list[dict[str, Any]], call: str, field: str, code: int
) -> None:
    node = with_errors(fakenvml.throttles_in_training(), 1, {call: code})
    sampler, _ = telemetry(monkeypatch, node)
    first, second = sampler.sample_once(), sampler.sample_once()
    assert first.values[field] is None
    assert second.values[field] is None
    assert second.values["temp_c" if field != "temp_c" else "util"] is not None
    assert [e["field"] for e in events(logs, "telemetry_field_dropped")] == [field]


def test_a_binding_without_the_new_reasons_call_uses_the_throttle_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = fakenvml.throttles_in_training()
    old = FakeNode(gpus=node.gpus, missing=frozenset({"nvmlDeviceGetCurrentClocksEventReasons"}))
    sampler, _ = telemetry(monkeypatch, old)
    sampler.sample_once()
    assert sampler.sample_once().reasons == pynvml.nvmlClocksEventReasonHwThermalSlowdown


def test_thermal_throttling_shows_from_the_scripted_sample_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, logs: list[dict[str, Any]]
) -> None:
    sampler, faults = telemetry(monkeypatch, fakenvml.throttles_in_training())
    first, second, third = (sampler.sample_once() for _ in range(3))
    assert first.reasons == pynvml.nvmlClocksEventReasonNone
    assert second.reasons == third.reasons == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert (second.values["temp_c"], second.values["sm_clock_mhz"]) == (89, 1410)
    (warning,) = events(logs, "gpu_throttled")
    assert warning["reasons"] == ["hw_thermal_slowdown"]
    assert UUIDS[1] in warning["gpu"]
    on_gpu, _host = telemetry_share.records(sampler.share(), step=10)
    assert on_gpu["throttle_hw_thermal_slowdown"] == 1
    assert faults == []


def test_a_rise_of_the_ecc_count_is_one_fault_naming_gpu_and_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sampler, faults = telemetry(monkeypatch, fakenvml.ecc_rises_in_training())
    for _ in range(2):
        sampler.sample_once()
    assert faults == []
    for _ in range(3):
        sampler.sample_once()
    assert faults == [
        f"GPU 1 ({UUIDS[1]}) on host {platform.node()}, rank 1: volatile uncorrected ECC"
        " errors rose from 0 to 1"
    ]


@pytest.mark.parametrize(
    ("xid", "fault", "logged"),
    [
        (79, "XID 79 (GPU has fallen off the bus)", "gpu_fault"),
        (48, "XID 48 (double-bit ECC error)", "gpu_fault"),
        (94, None, "gpu_event"),
        (13, None, "gpu_event_ignored"),
        (43, None, "gpu_event_ignored"),
    ],
)
def test_an_xid_event_is_graded(
    monkeypatch: pytest.MonkeyPatch,
    logs: list[dict[str, Any]],
    xid: int,
    fault: str | None,
    logged: str,
) -> None:
    node = fakenvml.change_gpu(fakenvml.training(1), 1, later=(Later(after=2, xids=(xid,)),))
    sampler, faults = telemetry(monkeypatch, node)
    sampler.sample_once()
    assert faults == []
    sampler.sample_once()
    assert [f.split(": ", 1)[1] for f in faults] == ([fault] if fault else [])
    (entry,) = events(logs, logged)
    assert entry["what"].startswith(f"XID {xid}")


def test_with_the_stop_off_a_fault_is_only_logged(
    monkeypatch: pytest.MonkeyPatch, logs: list[dict[str, Any]]
) -> None:
    config = HealthConfig(stop_on_gpu_fault=False)
    sampler, faults = telemetry(monkeypatch, fakenvml.xid79_in_training(), config=config)
    for _ in range(3):
        sampler.sample_once()
    assert faults == []
    assert len(events(logs, "gpu_fault")) == 1


def test_a_driver_that_refuses_events_gets_no_xid_watch_said_once(
    monkeypatch: pytest.MonkeyPatch, logs: list[dict[str, Any]]
) -> None:
    sampler, _ = telemetry(monkeypatch, fakenvml.no_events_in_training())
    for _ in range(3):
        assert sampler.sample_once().values["util"] == 97
    assert len(events(logs, "xid_watch_unsupported")) == 1


def test_a_gpu_lost_during_training_is_a_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = dict.fromkeys(fakenvml.DEVICE_CALLS, pynvml.NVML_ERROR_GPU_IS_LOST)
    node = fakenvml.change_gpu(
        fakenvml.training(1), 1, later=(Later(after=2, changes={"errors": lost}),)
    )
    sampler, faults = telemetry(monkeypatch, node)
    sampler.sample_once()
    sampler.sample_once()
    sampler.sample_once()
    (fault,) = faults
    assert "the GPU is lost" in fault
    assert UUIDS[1] in fault


def test_without_a_gpu_the_process_is_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, fakenvml.no_driver())
    made = for_rank(HealthConfig(), survey=GpuSurvey(), gpu_ordinal=0, rank=0, on_fault=None)
    assert made is not None
    made.open()
    sample = made.sample_once()
    assert set(sample.values) == {"cpu_percent", "rss_mib"}
    assert [r["kind"] for r in telemetry_share.records(made.share(), step=1)] == ["host"]


def test_nvml_failing_to_start_leaves_the_process_sampled(
    monkeypatch: pytest.MonkeyPatch, logs: list[dict[str, Any]]
) -> None:
    install(monkeypatch, fakenvml.healthy_node())
    survey = nvml.survey({})
    install(monkeypatch, FakeNode(gpus=(), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    made = for_rank(HealthConfig(), survey=survey, gpu_ordinal=0, rank=0, on_fault=None)
    assert made is not None
    made.open()
    assert set(made.sample_once().values) == {"cpu_percent", "rss_mib"}
    assert len(events(logs, "telemetry_without_nvml")) == 1


def test_telemetry_off_makes_no_sampler() -> None:
    config = HealthConfig(telemetry=False)
    assert for_rank(config, survey=GpuSurvey(), gpu_ordinal=0, rank=0, on_fault=None) is None


def test_the_training_thread_never_waits_for_a_stuck_nvml_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install(monkeypatch, fakenvml.throttles_in_training())
    survey = nvml.survey({})
    module = fakenvml_module()
    reading, release = threading.Event(), threading.Event()
    answer = module.nvmlDeviceGetPowerUsage
    calls = 0

    def stuck_power(handle: object) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:  # the second sample hangs inside NVML until released
            reading.set()
            release.wait()
        return int(answer(handle))

    monkeypatch.setattr(module, "nvmlDeviceGetPowerUsage", stuck_power)
    made = for_rank(
        HealthConfig(sample_every_s=0.05), survey=survey, gpu_ordinal=1, rank=1, on_fault=None
    )
    assert made is not None
    made.start()
    try:
        assert reading.wait(timeout=30)
        first = made.share()  # the sampler is stuck mid-sample: the first sample still answers
        (on_gpu, _host) = telemetry_share.records(first, step=1)
        assert on_gpu["power_w_max"] == 550
    finally:
        release.set()
        made.stop()


def test_grading_table() -> None:
    dbe = pynvml.nvmlEventTypeDoubleBitEccError
    assert grade_event(dbe, 0, fatal_xids=FATAL).level == "fatal"
    assert [grade_event(XID, x, fatal_xids=FATAL).level for x in (79, 94, 13, 62)] == [
        "fatal",
        "warn",
        "ignore",
        "warn",
    ]
    # A site may make XID 94 fatal too; application XIDs stay ignored whatever it lists.
    assert grade_event(XID, 94, fatal_xids=FATAL | {94, 13}).level == "fatal"
    assert grade_event(XID, 13, fatal_xids=FATAL | {94, 13}).level == "ignore"
    assert grade_ecc(0, 0) is None
    assert grade_ecc(None, 4) is None
    finding = grade_ecc(2, 3)
    assert finding is not None
    assert finding.level == "fatal"


def test_a_gpu_fault_outranks_signals_and_survives_them() -> None:
    requests = preempt.StopRequests()
    requests.code = preempt.REASONS.index("SIGTERM")
    requests.fault("GPU 1 (GPU-x) on host h, rank 1: XID 79")
    requests.code = preempt.REASONS.index("SIGINT")  # a signal handler after the fault
    assert preempt.REASONS[requests.code] == "GPU fault"


def test_an_agreed_gpu_fault_stop_exits_3_naming_the_gpu_and_host(tmp_path: Any) -> None:
    stopped = StoppedEarly(reason="GPU fault", step=12, checkpoint=tmp_path / "step-12.pt")
    own = stop_error(stopped, gpu_fault=f"GPU 1 ({UUIDS[1]}) on host node7, rank 1: XID 79")
    assert isinstance(own, PreflightError)
    assert own.exit_code == 3
    assert f"stopped after step 12 (GPU fault); checkpoint {tmp_path / 'step-12.pt'}" in own.line()
    assert f"GPU 1 ({UUIDS[1]}) on host node7" in own.line()
    other = stop_error(stopped, gpu_fault=None)
    assert other.exit_code == 3
    assert "another rank" in other.line()
    signal = stop_error(StoppedEarly(reason="SIGTERM", step=3, checkpoint=tmp_path), gpu_fault=None)
    assert isinstance(signal, Stopped)
    assert signal.exit_code == 143
