"""BackgroundSaver: snapshot at submit, write on a thread, one at a time, errors come back."""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainbox.checkpoint import files as checkpoint
from trainbox.checkpoint.saver import BackgroundSaver, snapshot, stable_storages
from trainbox.testing.faults import SAVE_POINTS


def test_snapshot_copies_every_tensor_and_keeps_the_structure() -> None:
    weight = torch.ones(3)
    state = {"model": {"w": weight}, "list": [weight, 1], "tuple": (weight, "x"), "step": 4}
    copied = snapshot(state)
    weight.add_(1)
    assert copied["model"]["w"].tolist() == [1.0, 1.0, 1.0]
    assert copied["list"][0].tolist() == [1.0, 1.0, 1.0]
    assert isinstance(copied["tuple"], tuple)
    assert copied["tuple"][1] == "x"
    assert copied["list"][1] == 1
    assert copied["step"] == 4


def test_snapshot_detaches_and_deep_copies_other_values() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    Pair = namedtuple("Pair", "a b")
    extra = {"nested": [1, 2]}
    copied = snapshot({"p": param, "pair": Pair(1, 2), "extra": extra})
    assert not copied["p"].requires_grad
    assert copied["pair"] == Pair(1, 2)
    extra["nested"].append(3)
    assert copied["extra"] == {"nested": [1, 2]}


def test_snapshot_copies_into_the_matching_tensors_of_an_earlier_one() -> None:
    weight, bias = torch.ones(2, 3), torch.zeros(3)
    earlier = snapshot({"model": {"w": weight, "b": bias}, "list": [weight]})
    weight.add_(1)
    bias = torch.zeros(4)  # a new shape: the earlier tensor cannot hold it
    copied = snapshot({"model": {"w": weight, "b": bias}, "list": [weight]}, into=earlier)
    assert copied["model"]["w"] is earlier["model"]["w"]
    assert copied["list"][0] is earlier["list"][0]
    assert copied["model"]["w"].tolist() == [[2.0] * 3] * 2
    assert copied["model"]["b"] is not earlier["model"]["b"]
    assert copied["model"]["b"].tolist() == [0.0] * 4


@pytest.mark.parametrize(
    "earlier",
    [
        pytest.param(torch.zeros(3, 2).t(), id="other-strides"),
        pytest.param(torch.zeros(2, 3, dtype=torch.float64), id="other-dtype"),
        pytest.param([torch.zeros(2, 3)], id="other-structure"),
    ],
)
def test_snapshot_copies_afresh_where_the_earlier_tensor_differs(earlier: Any) -> None:
    weight = torch.arange(6.0).reshape(2, 3)
    copied = snapshot({"w": weight}, into={"w": earlier})
    assert copied["w"] is not earlier
    assert copied["w"].dtype == weight.dtype
    assert copied["w"].stride() == weight.stride()
    assert torch.equal(copied["w"], weight)


def test_the_next_save_copies_into_the_last_snapshot_once_written(tmp_path: Path) -> None:
    given: list[tuple[int, float]] = []

    def save(directory: Path, step: int, payload: Any, *, hook: Any = None) -> Path:
        given.append((payload["w"].data_ptr(), payload["w"].sum().item()))
        return checkpoint.save(directory, step, payload, hook=hook)

    weight = torch.zeros(4)
    with BackgroundSaver(save=save) as saver:
        saver.submit(tmp_path, 1, {"step": 1, "model": {}, "w": weight})
        saver.join()
        weight.add_(5)
        saver.submit(tmp_path, 2, {"step": 2, "model": {}, "w": weight})
    (first, before), (second, after) = given
    assert second == first != weight.data_ptr()
    assert (before, after) == (0.0, 20.0)
    assert checkpoint.load(checkpoint.path_for(tmp_path, 1))["w"].tolist() == [0.0] * 4


def test_the_written_checkpoint_holds_the_state_at_submit(tmp_path: Path) -> None:
    weight = torch.zeros(4)
    with BackgroundSaver() as saver:
        saver.submit(tmp_path, 7, {"step": 7, "model": {"w": weight}})
        weight.add_(5)  # training goes on while the thread writes
        path = saver.join()
    assert path == checkpoint.path_for(tmp_path, 7)
    assert checkpoint.load(path)["model"]["w"].tolist() == [0.0] * 4
    assert saver.write_s > 0
    assert saver.blocked_s >= 0


def test_then_runs_after_the_save_with_its_path(tmp_path: Path) -> None:
    seen: list[Path] = []
    saver = BackgroundSaver()
    saver.submit(tmp_path, 1, {"step": 1, "model": {}}, then=seen.append)
    assert saver.join() == seen[0] == checkpoint.path_for(tmp_path, 1)
    assert saver.join() is None  # nothing submitted since


class Gate:
    """A save that waits until the test opens the gate, recording what it was asked to write."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.started = threading.Event()
        self.steps: list[int] = []

    def __call__(self, directory: Path, step: int, payload: Any, *, hook: Any = None) -> Path:
        del payload, hook
        self.started.set()
        assert self.open.wait(10)
        self.steps.append(step)
        return directory / f"{step}"


def test_a_second_submit_waits_for_the_write_in_flight(tmp_path: Path) -> None:
    gate = Gate()
    saver = BackgroundSaver(save=gate)
    saver.submit(tmp_path, 1, {})
    assert gate.started.wait(10)
    assert saver.busy
    second = threading.Thread(target=saver.submit, args=(tmp_path, 2, {}))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # blocked behind the first write
    gate.open.set()
    second.join(10)
    assert saver.join() == tmp_path / "2"
    assert gate.steps == [1, 2]
    assert not saver.busy


def failing(
    error: BaseException, *, at_step: int | None = None, calls: list[int] | None = None
) -> Callable[..., Path]:
    """A save that raises `error` (at `at_step` only, if given) and records the steps asked."""

    def save(directory: Path, step: int, payload: Any, *, hook: Any = None) -> Path:
        del payload, hook
        if calls is not None:
            calls.append(step)
        if at_step is None or step == at_step:
            raise error
        return directory / str(step)

    return save


def test_a_failed_write_is_raised_once_by_join(tmp_path: Path) -> None:
    saver = BackgroundSaver(save=failing(OSError(28, "No space left on device")))
    saver.submit(tmp_path, 3, {})
    with pytest.raises(OSError, match="No space"):
        saver.join()
    assert saver.join() is None


def test_a_failed_write_is_raised_by_the_next_submit(tmp_path: Path) -> None:
    calls: list[int] = []
    saver = BackgroundSaver(save=failing(RuntimeError("disk gone"), at_step=1, calls=calls))
    saver.submit(tmp_path, 1, {})
    with pytest.raises(RuntimeError, match="disk gone"):
        saver.submit(tmp_path, 2, {})
    assert calls == [1]  # the second save did not start


def test_the_hook_reaches_checkpoint_save(tmp_path: Path) -> None:
    points: list[str] = []
    with BackgroundSaver(hook=points.append) as saver:
        saver.submit(tmp_path, 2, {"step": 2, "model": {"w": torch.ones(1)}})
    assert points
    assert set(points) <= set(SAVE_POINTS)


def test_leaving_the_context_waits_and_raises_the_write_error(tmp_path: Path) -> None:
    save = failing(OSError(30, "Read-only file system"))
    with pytest.raises(OSError, match="Read-only"), BackgroundSaver(save=save) as saver:
        saver.submit(tmp_path, 1, {})


class Copying(torch.Tensor):
    """A tensor whose copy to CPU memory waits for `gate` (or raises `error`) once it starts."""

    gate = threading.Event()
    started = threading.Event()
    error: BaseException | None = None

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.Tensor.copy_, torch.Tensor.to):
            cls.started.set()
            if cls.error is not None:
                raise cls.error
            assert cls.gate.wait(10)
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.fixture
def copying() -> type[Copying]:
    """Copying with a fresh gate and no error, for one test."""
    Copying.gate, Copying.started, Copying.error = threading.Event(), threading.Event(), None
    return Copying


def storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def test_stable_tensors_are_copied_with_their_values_at_submit(tmp_path: Path) -> None:
    weight, moment = torch.zeros(4), torch.ones(4)
    with BackgroundSaver() as saver:
        saver.submit(
            tmp_path,
            3,
            {"step": 3, "model": {"w": weight}, "optimizer": {"m": [moment]}},
            stable={storage(weight), storage(moment)},
        )
        saver.settle()
        weight.add_(5)  # the optimizer step, once settle() returned
        moment.add_(5)
        path = saver.join()
    assert path is not None
    saved = checkpoint.load(path)
    assert saved["model"]["w"].tolist() == [0.0] * 4
    assert saved["optimizer"]["m"][0].tolist() == [1.0] * 4


def test_deferred_copies_reuse_the_last_snapshot_once_written(tmp_path: Path) -> None:
    given: list[int] = []

    def save(directory: Path, step: int, payload: Any, *, hook: Any = None) -> Path:
        del hook
        given.append(payload["w"].data_ptr())
        return directory / str(step)

    weight = torch.zeros(4)
    saver = BackgroundSaver(save=save)
    for step in (1, 2):
        saver.submit(tmp_path, step, {"w": weight}, stable={storage(weight)})
        saver.settle()
        saver.join()
    assert given[0] == given[1] != weight.data_ptr()


def test_settle_waits_for_the_deferred_copy_and_not_for_the_write(
    tmp_path: Path, copying: type[Copying]
) -> None:
    write = Gate()
    weight = torch.Tensor._make_subclass(copying, torch.zeros(4))
    saver = BackgroundSaver(save=write)
    saver.submit(tmp_path, 1, {"w": weight}, stable={storage(weight)})
    assert copying.started.wait(10)
    settling = threading.Thread(target=saver.settle)
    settling.start()
    settling.join(0.2)
    assert settling.is_alive()  # the copy has not finished
    copying.gate.set()
    settling.join(10)
    assert not settling.is_alive()
    assert saver.busy  # the write is still held at its gate
    assert saver.settle_s > 0
    write.open.set()
    assert saver.join() == tmp_path / "1"


def test_settle_returns_at_once_when_nothing_was_deferred(tmp_path: Path) -> None:
    write = Gate()
    saver = BackgroundSaver(save=write)
    saver.settle()  # nothing submitted yet
    saver.submit(tmp_path, 1, {"w": torch.zeros(2)})  # no stable tensors: all copied in submit
    saver.settle()
    assert saver.settle_s == 0.0
    write.open.set()
    saver.join()


def test_a_tensor_not_marked_stable_is_copied_in_submit(tmp_path: Path) -> None:
    write = Gate()
    weight, running_mean = torch.zeros(2), torch.zeros(2)
    recording = Recording(write)
    saver = BackgroundSaver(save=recording)
    saver.submit(tmp_path, 1, {"w": weight, "bn": running_mean}, stable={storage(weight)})
    running_mean.add_(7)  # BatchNorm's forward, before the optimizer step
    saver.settle()
    write.open.set()
    saver.join()
    assert recording.payloads[0]["bn"].tolist() == [0.0, 0.0]
    assert recording.payloads[0]["w"].tolist() == [0.0, 0.0]


def test_a_sparse_tensor_is_copied_in_submit_beside_stable_ones(tmp_path: Path) -> None:
    weight = torch.zeros(2)
    sparse = torch.zeros(3).to_sparse()
    write = Gate()
    write.open.set()
    recording = Recording(write)
    saver = BackgroundSaver(save=recording)
    saver.submit(tmp_path, 1, {"w": weight, "s": sparse}, stable={storage(weight)})
    saver.settle()
    saver.join()
    assert recording.payloads[0]["s"].is_sparse
    assert recording.payloads[0]["s"].to_dense().tolist() == [0.0] * 3


def test_a_failed_deferred_copy_is_raised_by_join_and_nothing_is_written(
    tmp_path: Path, copying: type[Copying]
) -> None:
    copying.error = MemoryError("cannot pin 1208 MB")
    calls: list[int] = []
    weight = torch.Tensor._make_subclass(copying, torch.zeros(4))
    saver = BackgroundSaver(save=failing(RuntimeError("unused"), at_step=-1, calls=calls))
    saver.submit(tmp_path, 2, {"w": weight}, stable={storage(weight)})
    saver.settle()  # returns: the sources may change, the snapshot is abandoned
    with pytest.raises(MemoryError, match="cannot pin"):
        saver.join()
    assert calls == []
    assert saver.join() is None


def test_stable_storages_are_the_parameters_and_the_optimizer_state() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 2)).sum().backward()
    optimizer.step()
    stable = stable_storages(model, optimizer)
    moments = [t for s in optimizer.state.values() for t in s.values()]
    assert {storage(p) for p in model.parameters()} <= stable
    assert {storage(t) for t in moments} <= stable
    assert not {storage(b) for b in model.buffers()} & stable


class Recording:
    """A save that records the payloads it is given, then calls `save`."""

    def __init__(self, save: Callable[..., Path]) -> None:
        self.save = save
        self.payloads: list[Any] = []

    def __call__(self, directory: Path, step: int, payload: Any, *, hook: Any = None) -> Path:
        self.payloads.append(payload)
        return self.save(directory, step, payload, hook=hook)
