"""Preflight judgement: plain facts in, ok/warn/fail/skip out (no NVML needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainbox.errors import PreflightError
from trainbox.preflight import Expectations, NodeFacts, Report, judge, node
from trainbox.preflight.facts import GpuFacts, GpuSurvey, Process

GOOD_GPU = GpuFacts(
    index=0, uuid="GPU-aaaa", name="NVIDIA H100", pci_bus_id="0000:1b:00.0",
    memory_total_mib=81559, memory_used_mib=0, ecc_uncorrected_volatile=0, recovery_action=0,
    remapped_uncorrectable=0, remap_pending=False, remap_failed=False, retired_pages_pending=False,
    clock_event_reasons=0x1, temperature_c=40, temperature_slowdown_c=90, pcie_gen=5, pcie_gen_max=5,
    pcie_width=16, pcie_width_max=16, mig_enabled=False, compute_mode=0, processes=(), persistence=True,
    cpu_affinity=frozenset(range(48)), numa_node=0,
)  # fmt: skip
NODE = NodeFacts(
    torch_cuda=(12, 8),
    shm_mib=65536,
    run_dir_problem=None,
    disk_free_mib=100_000,
    master_problem=None,
    # run_dir in a store this process probed: the one check a path run_dir skips.
    store_url="s3://runs/exp1",
    store_probed=True,
)
WANT = Expectations(
    gpus="auto", gpus_needed=2, own_gpu=None, world_size=4, num_workers=2, local_world_size=2,
    shm_mib_per_worker=256, min_free_disk_mib=1024, other_process_share=0.1,
)  # fmt: skip


def survey(*gpus: GpuFacts, **fields: object) -> GpuSurvey:
    base = {"driver_version": "570.124.06", "cuda_driver": (12, 8)}
    return GpuSurvey(gpus=gpus, **(base | fields))  # type: ignore[arg-type]


def gpu(index: int = 0, **fields: object) -> GpuFacts:
    return dataclasses.replace(GOOD_GPU, index=index, uuid=f"GPU-{index:04d}", **fields)  # type: ignore[arg-type]


def statuses(checks: tuple[object, ...]) -> dict[str, str]:
    return {c.name: c.status for c in checks}  # type: ignore[attr-defined]


def test_a_healthy_node_is_all_ok() -> None:
    found = statuses(judge(survey(gpu(0), gpu(1)), NODE, WANT))
    assert set(found.values()) == {"ok"}
    assert len(found) == 22


@pytest.mark.parametrize(
    ("fields", "name", "status", "words"),
    [
        ({"lost": "GPU is lost"}, "gpu_lost", "fail", "GPU is lost"),
        ({"ecc_uncorrected_volatile": 2}, "ecc", "fail", "2 volatile uncorrected ECC"),
        ({"recovery_action": 1}, "recovery_action", "fail", "GPU reset"),
        ({"remap_failed": True}, "row_remap", "fail", "row remapping failed"),
        ({"remap_pending": True}, "row_remap", "fail", "pending"),
        ({"remapped_uncorrectable": 600}, "row_remap", "fail", "600 rows"),
        ({"retired_pages_pending": True}, "retired_pages", "fail", "retired pages pending"),
        ({"clock_event_reasons": 0x40 | 0x1}, "clocks", "warn", "HW thermal"),
        ({"temperature_c": 87}, "temperature", "warn", "87 °C"),
        ({"pcie_width": 4}, "pcie_link", "warn", "x4 of x16"),
        ({"pcie_gen": 3}, "pcie_link", "warn", "gen 3 of 5"),
        ({"mig_enabled": True}, "mig", "fail", "MIG mode is on"),
        ({"compute_mode": 2}, "compute_mode", "fail", "PROHIBITED"),
        (
            {"processes": (Process(pid=77, used_mib=30000),)},
            "gpu_processes",
            "fail",
            "host PIDs 77",
        ),
        ({"processes": (Process(pid=77, used_mib=100),)}, "gpu_processes", "warn", "hold 100 MiB"),
        ({"persistence": False}, "persistence", "warn", "persistence mode is off"),
        ({"memory_used_mib": 40000}, "memory", "warn", "40000 of 81559 MiB"),
    ],
)
def test_one_bad_gpu_is_named_by_index_and_uuid(
    fields: dict[str, object], name: str, status: str, words: str
) -> None:
    checks = {c.name: c for c in judge(survey(gpu(0), gpu(1, **fields)), NODE, WANT)}
    assert checks[name].status == status
    assert words in checks[name].message
    assert "GPU 1 (GPU-0001" in checks[name].message
    assert checks[name].hint


def test_a_mig_instance_cannot_join_a_multi_rank_job() -> None:
    mig = gpu(0, mig_enabled=True, mig_uuid="MIG-1234")
    assert statuses(judge(survey(mig, gpu(1)), NODE, WANT))["mig"] == "fail"
    alone = dataclasses.replace(WANT, world_size=1, gpus_needed=1, local_world_size=1)
    assert statuses(judge(survey(mig), NODE, alone))["mig"] == "ok"


def test_unsupported_readings_are_skips_not_crashes() -> None:
    bare = GpuFacts(index=0, uuid="GPU-0000")
    found = statuses(
        judge(survey(bare, dataclasses.replace(bare, index=1, uuid="GPU-0001")), NODE, WANT)
    )
    per_gpu = ["memory", "ecc", "recovery_action", "row_remap", "retired_pages", "clocks",
               "temperature", "pcie_link", "mig", "compute_mode", "gpu_processes", "persistence"]  # fmt: skip
    assert {found[name] for name in per_gpu} == {"skip"}
    assert found["gpu_lost"] == "ok"


def test_other_processes_count_only_on_this_ranks_gpu() -> None:
    # Rank 0 must not blame rank 1 for the CUDA context rank 1 already made on GPU 1.
    busy = gpu(1, processes=(Process(pid=9, used_mib=30000),))
    rank0 = dataclasses.replace(WANT, own_gpu=0)
    assert statuses(judge(survey(gpu(0), busy), NODE, rank0))["gpu_processes"] == "ok"
    assert statuses(judge(survey(gpu(0), busy), NODE, WANT))["gpu_processes"] == "fail"


@pytest.mark.parametrize(
    ("gpus", "error", "driver", "count"),
    [("auto", "NVML Shared Library Not Found", "warn", None), ("require", "NVML Shared Library Not Found", "fail", None),
     ("off", None, "skip", None)],
)  # fmt: skip
def test_driver_policy(gpus: str, error: str | None, driver: str, count: str | None) -> None:
    found = statuses(
        judge(GpuSurvey(driver_error=error), NODE, dataclasses.replace(WANT, gpus=gpus))
    )
    assert found["driver"] == driver
    assert found.get("gpu_count") == count


NO_LIBRARY = "NVML could not start: NVML Shared Library Not Found (NVMLError_LibraryNotFound)"


@pytest.mark.parametrize(
    ("gpus", "devices", "status"),
    [("auto", False, "skip"), ("auto", True, "warn"), ("auto", None, "warn"),
     ("require", False, "fail"), ("require", True, "fail")],
)  # fmt: skip
def test_no_driver_is_news_only_where_there_is_an_nvidia_device(
    gpus: str, devices: bool | None, status: str
) -> None:
    """A CPU machine has nothing for a driver to drive: CPU mode is said, not warned about."""
    host = dataclasses.replace(NODE, nvidia_devices=devices)
    want = dataclasses.replace(WANT, gpus=gpus)
    (driver,) = [
        c for c in judge(GpuSurvey(driver_error=NO_LIBRARY), host, want) if c.name == "driver"
    ]
    assert driver.status == status
    assert driver.message.startswith("no " if status == "fail" else "no NVIDIA driver, CPU mode")


def test_a_cpu_machine_logs_no_preflight_warning_about_gpus() -> None:
    report = Report(
        checks=judge(
            GpuSurvey(driver_error=NO_LIBRARY),
            dataclasses.replace(NODE, nvidia_devices=False),
            dataclasses.replace(WANT, world_size=1, num_workers=0),
        ),
        fatal_names=frozenset({"driver"}),
    )
    assert [c["name"] for c in report.describe() if c["status"] in ("warn", "fail")] == []


def fake_host(root: Path, *, vendors: tuple[str, ...] = (), dev: tuple[str, ...] = ()) -> Path:
    """A sysfs PCI tree with one device per vendor ID, and /dev entries."""
    for number, vendor in enumerate(vendors):
        device = root / "sys/bus/pci/devices" / f"0000:{number:02x}:00.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(f"{vendor}\n")
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for name in dev:
        (root / "dev" / name).write_text("")
    return root


@pytest.mark.parametrize(
    ("vendors", "dev", "found"),
    [((), (), False), (("0x8086", "0x15b3"), ("null",), False), (("0x8086", "0x10de"), (), True),
     ((), ("nvidiactl", "nvidia0"), True)],
)  # fmt: skip
def test_nvidia_devices_are_read_from_the_pci_bus_and_dev(
    tmp_path: Path, vendors: tuple[str, ...], dev: tuple[str, ...], found: bool
) -> None:
    assert node.nvidia_devices(fake_host(tmp_path, vendors=vendors, dev=dev)) is found


def test_the_run_dir_finding_names_the_path() -> None:
    named = dataclasses.replace(NODE, run_dir="runs/example")
    (check,) = [c for c in judge(survey(gpu(0), gpu(1)), named, WANT) if c.name == "run_dir"]
    assert (check.status, check.message) == ("ok", "run_dir='runs/example' is writable")


@pytest.mark.parametrize(
    ("torch_cuda", "driver_cuda", "gpus", "status"),
    [((12, 8), (12, 8), "auto", "ok"), ((12, 8), (12, 4), "auto", "warn"), ((12, 8), (11, 8), "auto", "fail"),
     (None, (12, 8), "auto", "warn"), (None, (12, 8), "require", "fail"), ((12, 8), None, "auto", "skip")],
)  # fmt: skip
def test_cuda_versions(
    torch_cuda: tuple[int, int] | None, driver_cuda: tuple[int, int] | None, gpus: str, status: str
) -> None:
    node = dataclasses.replace(NODE, torch_cuda=torch_cuda)
    found = statuses(
        judge(
            survey(gpu(0), gpu(1), cuda_driver=driver_cuda),
            node,
            dataclasses.replace(WANT, gpus=gpus),
        )
    )
    assert found["cuda_version"] == status


def test_too_few_gpus_and_unmatched_entries() -> None:
    found = statuses(judge(survey(gpu(0), unmatched=("entry '7' matches no GPU",)), NODE, WANT))
    assert (found["gpu_count"], found["gpu_visibility"]) == ("fail", "fail")


@pytest.mark.parametrize(
    ("node", "want", "name", "status"),
    [
        (dataclasses.replace(NODE, shm_mib=64), WANT, "shm", "fail"),
        (
            dataclasses.replace(NODE, shm_mib=64),
            dataclasses.replace(WANT, num_workers=0),
            "shm",
            "ok",
        ),
        (
            dataclasses.replace(NODE, run_dir_problem="run_dir='/ro' is not writable"),
            WANT,
            "run_dir",
            "fail",
        ),
        (dataclasses.replace(NODE, disk_free_mib=10), WANT, "disk_space", "fail"),
        (
            dataclasses.replace(NODE, master_problem="MASTER_ADDR 'n9' does not resolve"),
            WANT,
            "master_address",
            "fail",
        ),
        (
            dataclasses.replace(NODE, master_problem="x"),
            dataclasses.replace(WANT, world_size=1),
            "master_address",
            "skip",
        ),
    ],
)
def test_node_checks(node: NodeFacts, want: Expectations, name: str, status: str) -> None:
    assert statuses(judge(survey(gpu(0), gpu(1)), node, want))[name] == status


def test_report_lists_every_fatal_finding_once_and_exits_3() -> None:
    checks = judge(
        survey(gpu(0, ecc_uncorrected_volatile=1), gpu(1, remap_failed=True)), NODE, WANT
    )
    report = Report(checks=checks, fatal_names=frozenset({"ecc", "row_remap"}))
    with pytest.raises(PreflightError) as caught:
        report.raise_if_fatal()
    assert caught.value.exit_code == 3
    line = caught.value.line()
    assert "ecc: GPU 0 (GPU-0000): 1 volatile uncorrected ECC error(s)" in line
    assert "row_remap: GPU 1 (GPU-0001): row remapping failed" in line
    assert "HINT: drain the node" in line


def test_a_failure_left_out_of_preflight_fatal_only_warns() -> None:
    checks = judge(survey(gpu(0, ecc_uncorrected_volatile=1), gpu(1)), NODE, WANT)
    report = Report(checks=checks, fatal_names=frozenset())
    report.raise_if_fatal()
    assert {c["name"]: c["status"] for c in report.describe()}["ecc"] == "warn"


@pytest.mark.parametrize(
    ("facts", "status", "words"),
    [
        ({"store_url": ""}, "skip", "run_dir is a file system path"),
        ({"store_probed": False}, "skip", "probed by local rank 0 of this node"),
        ({}, "ok", "s3://runs/exp1 takes a probe object"),
        (
            {"store_problem": ("bucket 'runs' does not exist", "create it")},
            "fail",
            "does not exist",
        ),
    ],
)
def test_the_storage_check_judges_the_probe_of_an_s3_run_dir(
    facts: dict[str, object], status: str, words: str
) -> None:
    (check,) = [
        c
        for c in judge(survey(gpu(0)), dataclasses.replace(NODE, **facts), WANT)
        if c.name == "storage"
    ]
    assert (check.status, words in check.message) == (status, True)
    if status == "fail":
        assert check.hint == "create it"
