"""nvml.survey against a fake pynvml (tests/fakenvml.py): scenarios, CUDA_VISIBLE_DEVICES, errors."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from trainbox.preflight import nvml
from trainbox.preflight.facts import GpuFacts, GpuSurvey, Process

import fakenvml
from fakenvml import MIG_UUIDS, UUIDS, FakeNode, change_gpu, healthy_node, install, with_errors

BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def healthy(index: int) -> GpuFacts:
    """What survey should say about GPU `index` of healthy_node()."""
    return GpuFacts(
        index=index,
        uuid=UUIDS[index],
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"0000:{BUS[index]}:00.0",
        memory_total_mib=81559,
        memory_used_mib=0,
        ecc_uncorrected_volatile=0,
        recovery_action=0,
        remapped_uncorrectable=0,
        remap_pending=False,
        remap_failed=False,
        retired_pages_pending=None,
        clock_event_reasons=pynvml.nvmlClocksEventReasonGpuIdle,
        temperature_c=34,
        temperature_slowdown_c=87,
        pcie_gen=5,
        pcie_gen_max=5,
        pcie_width=16,
        pcie_width_max=16,
        mig_enabled=False,
        compute_mode=0,
        processes=(),
        persistence=True,
        cpu_affinity=frozenset(range(48)) if index < 4 else frozenset(range(48, 96)),
        numa_node=index // 4,
    )


def bare(index: int) -> GpuFacts:
    """GPU `index` of healthy_node() when every optional call says NotSupported."""
    facts = healthy(index)
    return GpuFacts(index=index, uuid=facts.uuid, name=facts.name, pci_bus_id=facts.pci_bus_id)


def take(monkeypatch: pytest.MonkeyPatch, node: FakeNode, mask: str | None = None) -> GpuSurvey:
    """Survey `node` with CUDA_VISIBLE_DEVICES=`mask` (unset when None)."""
    install(monkeypatch, node)
    return nvml.survey({} if mask is None else {"CUDA_VISIBLE_DEVICES": mask})


# scenario, GPU it changes, the facts that differ from a healthy H100.
SCENARIOS: list[tuple[Callable[[], FakeNode], int, dict[str, Any]]] = [
    (fakenvml.healthy_node, 0, {}),
    (fakenvml.ecc_uncorrectable, 3, {"ecc_uncorrected_volatile": 2}),
    (
        fakenvml.row_remap_failure,
        5,
        {"remapped_uncorrectable": 4, "remap_pending": True, "remap_failed": True},
    ),
    (fakenvml.mig_instances, 0, {"mig_enabled": True}),
    (fakenvml.pcie_x4, 2, {"pcie_width": 4}),
    (
        fakenvml.busy_gpu,
        1,
        {"memory_used_mib": 31232, "processes": (Process(pid=4242, used_mib=30720),)},
    ),
    (fakenvml.recovery_reset, 4, {"recovery_action": pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET}),
    (
        fakenvml.thermal_throttle,
        7,
        {"temperature_c": 87, "clock_event_reasons": pynvml.nvmlClocksEventReasonHwThermalSlowdown},
    ),
]


@pytest.mark.parametrize(
    ("scenario", "index", "changes"), SCENARIOS, ids=[s[0].__name__ for s in SCENARIOS]
)
def test_scenario_changes_one_gpu(
    monkeypatch: pytest.MonkeyPatch,
    scenario: Callable[[], FakeNode],
    index: int,
    changes: dict[str, Any],
) -> None:
    expected = [healthy(i) for i in range(8)]
    expected[index] = dataclasses.replace(expected[index], **changes)
    survey = take(monkeypatch, scenario())
    assert survey == GpuSurvey(
        driver_version="570.124.06", cuda_driver=(12, 8), gpus=tuple(expected)
    )


def test_lost_gpu_is_listed_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    survey = take(monkeypatch, fakenvml.lost_gpu())
    assert survey.gpus[6] == GpuFacts(
        index=6, uuid="", lost="NVML: GPU is lost (reading the device handle)"
    )
    assert survey.gpus[:6] + survey.gpus[7:] == tuple(healthy(i) for i in (0, 1, 2, 3, 4, 5, 7))


def test_no_driver_gives_driver_error_and_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    survey = take(monkeypatch, fakenvml.no_driver())
    assert survey == GpuSurvey(
        driver_error="NVML could not start: NVML Shared Library Not Found "
        "(NVMLError_LibraryNotFound)"
    )


def test_all_optional_unsupported_leaves_only_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    survey = take(monkeypatch, fakenvml.all_optional_unsupported())
    assert survey.gpus == tuple(bare(i) for i in range(8))


def test_missing_pynvml_is_a_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    survey = nvml.survey({})
    assert survey.gpus == ()
    assert survey.driver_error is not None
    assert "nvidia-ml-py" in survey.driver_error


def test_one_init_and_one_shutdown_per_survey(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install(monkeypatch, fakenvml.mig_instances())
    nvml.survey({"CUDA_VISIBLE_DEVICES": MIG_UUIDS[0]})
    assert (module.fake.inits, module.fake.shutdowns) == (1, 1)


def test_failing_device_count_is_a_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def count() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    module = install(monkeypatch, healthy_node())
    monkeypatch.setattr(module, "nvmlDeviceGetCount", count)
    survey = nvml.survey({})
    assert survey.gpus == ()
    assert survey.driver_error == "NVML could not count GPUs: Unknown Error (NVMLError_Unknown)"
    assert survey.driver_version == "570.124.06"


# CUDA_VISIBLE_DEVICES, the NVML indices CUDA then shows, and the unmatched report.
U = UUIDS
MASKS: list[tuple[str, str | None, list[int], tuple[str, ...]]] = [
    ("unset", None, list(range(8)), ()),
    ("empty", "", [], ()),
    ("blank", "  ", [], ()),
    ("reorder", "3,1", [3, 1], ()),
    ("spaces", " 2 , 3 ", [2, 3], ()),
    ("strtoul", "1gpu2,+3", [1, 3], ()),
    ("full uuid", U[4], [4], ()),
    ("uuid prefix", "GPU-5a7e", [1], ()),
    ("uuid order", f"{U[7]},GPU-2f", [7, 0], ()),
    (
        "invalid index truncates",
        "1,9,2",
        [1],
        ("CUDA_VISIBLE_DEVICES entry '9' matches no GPU (8 visible to NVML)",),
    ),
    (
        "unknown uuid truncates",
        "GPU-5a7e,GPU-0000,GPU-2f",
        [1],
        ("CUDA_VISIBLE_DEVICES entry 'GPU-0000' matches no GPU (8 visible to NVML)",),
    ),
    (
        "ambiguous prefix truncates",
        "GPU-5a7e,GPU-8c,GPU-2f",
        [1],
        ("CUDA_VISIBLE_DEVICES entry 'GPU-8c' is ambiguous: 2 GPU UUIDs start with it",),
    ),
    (
        "duplicate empties",
        "0,1,0",
        [],
        ("CUDA_VISIBLE_DEVICES entry '0' repeats GPU 0, so CUDA shows none",),
    ),
    (
        "duplicate by uuid empties",
        "GPU-5a7e,GPU-5a7e3c",
        [],
        ("CUDA_VISIBLE_DEVICES entry 'GPU-5a7e3c' repeats GPU 1, so CUDA shows none",),
    ),
    ("negative", "-1,2", [], ("CUDA_VISIBLE_DEVICES entry '-1' is negative",)),
    (
        "garbage",
        "abc,2",
        [],
        ("CUDA_VISIBLE_DEVICES entry 'abc' is neither an index nor a GPU-/MIG- UUID",),
    ),
    (
        "empty entry",
        "1,,2",
        [1],
        ("CUDA_VISIBLE_DEVICES entry '' is neither an index nor a GPU-/MIG- UUID",),
    ),
    (
        "mixed kinds",
        "1,GPU-2f",
        [1],
        ("CUDA_VISIBLE_DEVICES entry 'GPU-2f' is a GPU UUID in a list of indices",),
    ),
]


@pytest.mark.parametrize(
    ("mask", "indices", "unmatched"), [m[1:] for m in MASKS], ids=[m[0] for m in MASKS]
)
def test_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, mask: str | None, indices: list[int], unmatched: tuple[str]
) -> None:
    survey = take(monkeypatch, healthy_node(), mask)
    assert [gpu.index for gpu in survey.gpus] == indices
    assert survey.unmatched == unmatched
    assert all(gpu == healthy(gpu.index) for gpu in survey.gpus)


def test_mig_uuid_names_the_parent_with_instance_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    survey = take(monkeypatch, fakenvml.mig_instances(), MIG_UUIDS[1])
    assert survey.unmatched == ()
    assert survey.gpus == (
        dataclasses.replace(
            healthy(0),
            mig_uuid=MIG_UUIDS[1],
            mig_enabled=True,
            memory_total_mib=40192,
            memory_used_mib=0,
        ),
    )


@pytest.mark.parametrize(
    ("mask", "unmatched"),
    [
        (
            f"{MIG_UUIDS[0]},{MIG_UUIDS[1]}",
            f"entry '{MIG_UUIDS[1]}' is a second MIG instance, but CUDA uses only the first",
        ),
        (f"{MIG_UUIDS[0]},0", "entry '0' is an index in a list of MIG UUIDs"),
    ],
    ids=["second mig", "mig then index"],
)
def test_cuda_shows_one_mig_instance(
    monkeypatch: pytest.MonkeyPatch, mask: str, unmatched: str
) -> None:
    survey = take(monkeypatch, fakenvml.mig_instances(), mask)
    assert [(gpu.index, gpu.mig_uuid) for gpu in survey.gpus] == [(0, MIG_UUIDS[0])]
    assert survey.unmatched == (f"CUDA_VISIBLE_DEVICES {unmatched}",)


def test_unknown_mig_uuid_matches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    survey = take(monkeypatch, fakenvml.mig_instances(), "MIG-00000000-1111")
    assert survey.gpus == ()
    assert survey.unmatched == (
        "CUDA_VISIBLE_DEVICES entry 'MIG-00000000-1111' matches no MIG instance (Not Found)",
    )


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_TIMEOUT,
    ],
    ids=lambda code: type(pynvml.NVMLError(code)).__name__,
)
def test_a_failing_call_only_blanks_its_field(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    node = with_errors(healthy_node(), 2, {"nvmlDeviceGetTemperature": code})
    survey = take(monkeypatch, node)
    assert survey.gpus[2] == dataclasses.replace(healthy(2), temperature_c=None)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
        (pynvml.NVML_ERROR_RESET_REQUIRED, "GPU requires restart"),
        (pynvml.NVML_ERROR_CORRUPTED_INFOROM, "Corrupted infoROM"),
    ],
    ids=["gpu lost", "reset required", "corrupted inforom"],
)
def test_a_lost_answer_marks_the_gpu_lost(
    monkeypatch: pytest.MonkeyPatch, code: int, text: str
) -> None:
    node = with_errors(healthy_node(), 2, {"nvmlDeviceGetTotalEccErrors": code})
    survey = take(monkeypatch, node)
    assert survey.gpus[2] == dataclasses.replace(
        healthy(2), ecc_uncorrected_volatile=None, lost=f"NVML: {text} (reading ECC errors)"
    )


def test_the_first_lost_answer_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    errors = {
        "nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST,
        "nvmlDeviceGetNumaNodeId": pynvml.NVML_ERROR_RESET_REQUIRED,
    }
    survey = take(monkeypatch, with_errors(healthy_node(), 0, errors))
    assert survey.gpus[0].lost == "NVML: GPU is lost (reading memory)"
    assert survey.gpus[0].numa_node is None


def test_recovery_field_unsupported_by_older_drivers(monkeypatch: pytest.MonkeyPatch) -> None:
    survey = take(monkeypatch, change_gpu(healthy_node(), 0, recovery_action=None))
    assert survey.gpus[0] == dataclasses.replace(healthy(0), recovery_action=None)


@pytest.mark.parametrize(
    ("missing", "errors", "changes"),
    [
        ({"nvmlDeviceGetCurrentClocksEventReasons"}, {}, {}),
        ({}, {"nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}, {}),
        ({"nvmlDeviceGetCpuAffinityWithinScope"}, {}, {}),
        ({"nvmlDeviceGetNumaNodeId"}, {}, {"numa_node": None}),
        (
            {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"},
            {},
            {"clock_event_reasons": None},
        ),
    ],
    ids=["old clocks name", "driver lacks new clocks", "old affinity", "no numa", "no clocks"],
)
def test_older_bindings_fall_back_or_blank(
    monkeypatch: pytest.MonkeyPatch,
    missing: set[str],
    errors: dict[str, int],
    changes: dict[str, Any],
) -> None:
    node = dataclasses.replace(with_errors(healthy_node(), 0, errors), missing=frozenset(missing))
    survey = take(monkeypatch, node)
    assert survey.gpus[0] == dataclasses.replace(healthy(0), **changes)


def test_bytes_from_old_bindings_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    node = dataclasses.replace(healthy_node(), legacy_bytes=True)
    survey = take(monkeypatch, node, f"{UUIDS[5]},GPU-2f")
    assert survey.driver_version == "570.124.06"
    assert survey.gpus == (healthy(5), healthy(0))


@pytest.mark.parametrize(
    ("nvml_form", "sysfs_form"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("00000001:AB:1F.7", "0001:ab:1f.7"),
        ("0000:3b:00.0", "0000:3b:00.0"),
    ],
)
def test_pci_bus_id_in_sysfs_form(
    monkeypatch: pytest.MonkeyPatch, nvml_form: str, sysfs_form: str
) -> None:
    survey = take(monkeypatch, change_gpu(healthy_node(), 0, pci_bus_id=nvml_form))
    assert survey.gpus[0].pci_bus_id == sysfs_form


def test_cpu_affinity_words_past_cpu_63(monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = frozenset({0, 63, 64, 127, 128, 191})
    node = dataclasses.replace(change_gpu(healthy_node(), 0, cpu_affinity=cpus), cpu_count=192)
    assert take(monkeypatch, node).gpus[0].cpu_affinity == cpus


def test_cuda_driver_version_is_major_minor(monkeypatch: pytest.MonkeyPatch) -> None:
    node = dataclasses.replace(healthy_node(), cuda_driver_version=13010)
    assert take(monkeypatch, node).cuda_driver == (13, 1)


def test_count_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, healthy_node())
    assert nvml.count_visible_gpus({"CUDA_VISIBLE_DEVICES": "1,3"}) == 2
    install(monkeypatch, fakenvml.no_driver())
    assert nvml.count_visible_gpus({}) == 0


def test_fake_uses_only_real_pynvml_names() -> None:
    module = fakenvml.fake_pynvml(healthy_node())
    names = [name for name in vars(module) if name.startswith(("nvml", "NVML"))]
    assert [name for name in names if not hasattr(pynvml, name)] == []


def test_real_pynvml_never_raises() -> None:
    # No driver here gives driver_error; a GPU host gives GPUs; either way no exception.
    survey = nvml.survey({})
    assert isinstance(survey, GpuSurvey)
    assert survey.driver_error is None or survey.gpus == ()
    if survey.driver_error is not None:
        assert nvml.count_visible_gpus({}) == 0
