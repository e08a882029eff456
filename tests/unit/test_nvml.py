"""GPU listing through NVML: no driver, no GPUs; CUDA_VISIBLE_DEVICES picks by index or UUID.

No GPU or driver exists on the CI machine, so a stand-in `pynvml` module with the real API's
names (nvmlInit, nvmlDeviceGetCount, ..., NVMLError) is put in sys.modules.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest

from trainbox.preflight import nvml

GPUS = [
    nvml.GpuInfo(index=i, uuid=f"GPU-{i}aaa-{i}", name="NVIDIA H100", memory_mib=81559)
    for i in range(4)
]


def fake_pynvml(count: int, *, init_error: bool = False) -> types.ModuleType:
    """A pynvml stand-in with `count` GPUs, or failing nvmlInit like a host with no driver."""
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init() -> None:
        if init_error:
            raise NVMLError("NVML Shared Library Not Found")

    module.NVMLError = NVMLError
    module.nvmlInit = init
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: count
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetUUID = lambda handle: f"GPU-{handle}aaa-{handle}".encode()
    module.nvmlDeviceGetName = lambda _handle: "NVIDIA H100"
    module.nvmlDeviceGetMemoryInfo = lambda _handle: types.SimpleNamespace(total=81559 * 2**20)
    return module


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Callable[[types.ModuleType], None]:
    return lambda module: monkeypatch.setitem(sys.modules, "pynvml", module)


def test_no_driver_means_no_gpus(install: Callable[[types.ModuleType], None]) -> None:
    install(fake_pynvml(0, init_error=True))
    assert nvml.visible_gpus({}) == []


def test_all_gpus_without_a_mask(install: Callable[[types.ModuleType], None]) -> None:
    install(fake_pynvml(4))
    assert nvml.visible_gpus({}) == GPUS


@pytest.mark.parametrize(
    ("mask", "indices"),
    [
        ("2,0", [2, 0]),
        ("GPU-3aaa-3,1", [3, 1]),
        ("GPU-1", [1]),
        ("1,7,2", [1]),  # CUDA stops at the first invalid entry
        ("0,0,1", [0]),  # and at a repeated one
        ("", []),
        ("-1", []),
        ("MIG-abc", []),
    ],
)
def test_cuda_visible_devices(mask: str, indices: list[int]) -> None:
    assert [gpu.index for gpu in nvml.select_visible(GPUS, mask)] == indices


def test_count_visible_gpus(install: Callable[[types.ModuleType], None]) -> None:
    install(fake_pynvml(4))
    assert nvml.count_visible_gpus({"CUDA_VISIBLE_DEVICES": "1,3"}) == 2
