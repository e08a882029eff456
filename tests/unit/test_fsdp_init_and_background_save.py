"""fsdp's state-side keys at one rank: init_from into a sharded model (from a one-file and a
sharded checkpoint, exact, prefix and strictness as DDP's), user state that cannot be a shard,
and sharded checkpoints written in the background from a copy taken at the save.

A real gloo group of one (in-memory store) and real DCP files, as in test_sharded_checkpoints;
tests/dist/test_fsdp_state.py runs the same at two ranks under torchrun.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from trainbox import config
from trainbox.checkpoint import files, schema, shards
from trainbox.checkpoint.schema import Payload
from trainbox.config import Config
from trainbox.errors import UsageError
from trainbox.launch.context import LaunchContext
from trainbox.tasks.mlp import mlp
from trainbox.train.parallel.fsdp import wrap
from trainbox.train.resume import init_from
from trainbox.train.resume.checkpoints import Checkpointer
from trainbox.train.resume.state import TrainState, build_user_state, params_sha256, tensors_sha256
from trainbox.train.steps.user_code import UserFn, choose
from trainbox.train.watch.control import RunControl

CPU = torch.device("cpu")
ONE = LaunchContext(launcher="single", flavor="", rank=0, local_rank=0, world_size=1,
                    local_world_size=1, node_rank=0, num_nodes=1, master_addr="",
                    master_port=0)  # fmt: skip


@pytest.fixture
def world_of_one() -> Iterator[None]:
    # An in-memory store: a real gloo group with no port and nothing left behind.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def fsdp_config(*extra: str) -> Config:
    return config.load(None, ["train.strategy=fsdp", *extra])


def sharded_state(seed: int, *extra: str, hidden: int = 4) -> TrainState:
    """A one-rank fsdp TrainState of a two-layer MLP whose weights come from `seed`."""
    settings = fsdp_config(*extra)
    torch.manual_seed(seed)
    model = mlp(in_features=2, out_features=2, hidden=hidden, layers=1)
    wrap(model, CPU, world_size=1, amp_dtype=None, units=None)
    return TrainState(settings, model, user_code=choose(settings), world_size=1, device=CPU,
                      amp_dtype=None)  # fmt: skip


def trained(state: TrainState) -> TrainState:
    state.module(torch.ones(4, 2)).sum().backward()
    state.optimizer.step()
    state.scheduler.step()
    state.step += 1
    return state


def sharded_checkpoint(state: TrainState, directory: Path) -> Path:
    record = state.payload(config={}, config_hash="", rng=[], sharded=True).to_dict()
    return shards.save(directory, state.step, state.sharded_tensors(), record=record, device=CPU)


def one_file_checkpoint(weights: dict[str, torch.Tensor], directory: Path) -> Path:
    payload = Payload(step=3, model=weights, optimizer={})
    return files.save(directory, 3, payload.to_dict())


def unsharded(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return dict(mlp(in_features=2, out_features=2, hidden=4, layers=1).state_dict())


# ---- the pure decision: which tensors to load, and why they do not fit ----

MODEL = {"0.weight": torch.empty(4, 2), "0.bias": torch.empty(4), "2.weight": torch.empty(2, 4)}
PLANS = [
    ("", True, {f"{k}": v for k, v in MODEL.items()}, {k: k for k in MODEL}, []),
    ("net", True, {f"net.{k}": v for k, v in MODEL.items()}, {k: f"net.{k}" for k in MODEL}, []),
    ("net.", False, {"net.0.bias": torch.empty(4), "other": torch.empty(1)},
     {"0.bias": "net.0.bias"}, []),
    ("", True, {"0.weight": torch.empty(4, 2)}, {},
     ["train.init_from SRC does not fit the model", "missing from the checkpoint: 0.bias, 2.weight"]),
    ("", False, {"0.weight": torch.empty(3, 2)}, {},
     ["train.init_from SRC does not fit the model",
      "shapes differ: 0.weight (3, 2) vs the model's (4, 2)"]),
    ("enc", False, {"dec.0.weight": torch.empty(4, 2)}, {},
     ["train.init_from SRC under prefix 'enc' does not fit the model",
      "no tensor of the checkpoint matches the model's names"]),
]  # fmt: skip


@pytest.mark.parametrize(("prefix", "strict", "saved", "names", "problems"), PLANS)
def test_the_load_plan_maps_model_names_to_saved_names_or_says_why_not(
    prefix: str, strict: bool, saved: dict[str, Any], names: dict[str, str], problems: list[str]
) -> None:
    plan = init_from.plan_load(MODEL, saved, where="SRC", prefix=prefix, strict=strict)
    assert plan == (names, problems)


def test_a_sharded_source_is_a_dcp_folder_or_a_run_dir_holding_them(tmp_path: Path) -> None:
    checkpoints = tmp_path / "run" / "checkpoints"
    for step in (7, 14):
        (checkpoints / f"step-{step:08d}.dcp").mkdir(parents=True)
    newest_first = [checkpoints / "step-00000014.dcp", checkpoints / "step-00000007.dcp"]
    assert init_from.shard_candidates(tmp_path / "run") == newest_first
    assert init_from.shard_candidates(checkpoints) == newest_first
    assert init_from.shard_candidates(newest_first[1]) == [newest_first[1]]
    (tmp_path / "x.pt").write_bytes(b"")
    assert init_from.shard_candidates(tmp_path / "x.pt") == []
    assert init_from.shard_candidates(tmp_path) == []  # no .dcp: DDP's one-file reading


# ---- init_from into a sharded model ----


def test_a_sharded_checkpoints_weights_load_exactly(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    source = trained(sharded_state(seed=0))
    path = sharded_checkpoint(source, tmp_path / "checkpoints")
    fresh = sharded_state(seed=1)
    assert params_sha256(fresh.module) != params_sha256(source.module)
    used = init_from.init_sharded(fresh.module, source=str(tmp_path), prefix="", strict=True,
                                  rank=0, world_size=1)  # fmt: skip
    assert used == path
    assert params_sha256(fresh.module) == params_sha256(source.module)


def test_a_sharded_checkpoints_submodule_loads_exactly_under_a_prefix(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    torch.manual_seed(3)
    outer = torch.nn.Sequential(OrderedDict(net=mlp(in_features=2, out_features=2, hidden=4,
                                                    layers=1)))  # fmt: skip
    wanted = tensors_sha256(outer.net.state_dict())
    wrap(outer, CPU, world_size=1, amp_dtype=None, units=None)
    path = shards.save(tmp_path, 1, {shards.MODEL: get_model_state_dict(outer)},
                       record=Payload(step=1, model={}, optimizer={}, sharded=True).to_dict(),
                       device=CPU)  # fmt: skip
    fresh = sharded_state(seed=1)
    init_from.init_sharded(fresh.module, source=str(path), prefix="net", strict=True, rank=0,
                           world_size=1)  # fmt: skip
    assert params_sha256(fresh.module) == wanted


def test_a_one_file_checkpoints_weights_load_exactly_under_a_prefix(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    weights = unsharded(seed=5)
    path = one_file_checkpoint({f"net.{k}": v for k, v in weights.items()}, tmp_path)
    fresh = sharded_state(seed=1)
    used = init_from.init_sharded(fresh.module, source=str(path), prefix="net", strict=True,
                                  rank=0, world_size=1)  # fmt: skip
    assert used == path
    assert params_sha256(fresh.module) == tensors_sha256(weights)


def test_a_partial_load_keeps_the_rest_only_when_not_strict(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    weights = unsharded(seed=5)
    path = one_file_checkpoint({"0.weight": weights["0.weight"]}, tmp_path)
    with pytest.raises(UsageError) as caught:
        init_from.init_sharded(sharded_state(seed=1).module, source=str(path), prefix="",
                               strict=True, rank=0, world_size=1)  # fmt: skip
    assert caught.value.problems[1].startswith("missing from the checkpoint: 0.bias")
    assert "train.init_strict=false" in caught.value.hint
    fresh, before = sharded_state(seed=1), unsharded(seed=1)
    init_from.init_sharded(fresh.module, source=str(path), prefix="", strict=False,
                           rank=0, world_size=1)  # fmt: skip
    after = {k: v.full_tensor() for k, v in fresh.module.state_dict().items()}
    assert torch.equal(after["0.weight"], weights["0.weight"])
    assert torch.equal(after["0.bias"], before["0.bias"])


def test_shards_of_another_model_are_named_before_anything_loads(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    path = sharded_checkpoint(sharded_state(seed=0), tmp_path)
    with pytest.raises(UsageError) as caught:
        init_from.init_sharded(sharded_state(seed=1, hidden=6).module, source=str(path),
                               prefix="", strict=True, rank=0, world_size=1)  # fmt: skip
    assert caught.value.problems == [
        f"train.init_from {path} does not fit the model",
        "shapes differ: 0.weight (4, 2) vs the model's (6, 2), 0.bias (4,) vs the model's (6,),"
        " 2.weight (2, 4) vs the model's (2, 6)",
    ]


def test_a_damaged_sharded_source_is_named(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    path = sharded_checkpoint(sharded_state(seed=0), tmp_path)
    (path / "__0_0.distcp").write_bytes(b"torn")
    with pytest.raises(UsageError, match=r"holds no valid checkpoint \(.*does not match"):
        init_from.init_sharded(sharded_state(seed=1).module, source=str(path), prefix="",
                               strict=True, rank=0, world_size=1)  # fmt: skip


def test_a_missing_one_file_source_is_one_error(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    with pytest.raises(UsageError) as caught:
        init_from.init_sharded(sharded_state(seed=1).module, source=str(tmp_path / "no.pt"),
                               prefix="", strict=True, rank=0, world_size=1)  # fmt: skip
    assert caught.value.problems[0].startswith(f"train.init_from={str(tmp_path / 'no.pt')!r}")
    assert "train.init_prefix" in caught.value.hint


# ---- user state beside a sharded model ----


class Holder:
    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


def test_user_state_holding_a_shard_is_refused_with_the_way_out(world_of_one: None) -> None:
    del world_of_one
    mesh = init_device_mesh("cpu", (1,))
    shard = distribute_tensor(torch.ones(2, 2), mesh, [Shard(0)])
    factory = UserFn(name="pkg:ema", fn=lambda _model, _optimizer: {"ema": Holder(shard)})
    model = torch.nn.Linear(2, 2)
    with pytest.raises(UsageError) as caught:
        build_user_state(factory, model, torch.optim.SGD(model.parameters()))
    assert "'ema' at state['value']: DTensor" in caught.value.problems[0]
    assert ".full_tensor()" in caught.value.hint
    whole = UserFn(
        name="pkg:ema", fn=lambda _model, _optimizer: {"ema": Holder(shard.full_tensor())}
    )
    assert set(build_user_state(whole, model, torch.optim.SGD(model.parameters()))) == {"ema"}


# ---- sharded checkpoints written in the background ----


def test_a_background_sharded_save_writes_the_state_of_its_step_on_the_writer_thread(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    settings = fsdp_config("train.async_save=true", "train.keep_last=1")
    state = trained(sharded_state(0, "train.async_save=true"))
    control = RunControl()
    threads: list[tuple[str, int, str]] = []
    stepped = threading.Event()

    def at_save(point: str, step: int) -> None:
        threads.append((point, step, threading.current_thread().name))
        if point == "open" and step == 1:
            assert stepped.wait(timeout=60)  # the writer starts only once training moved on

    control.at_save = at_save  # type: ignore[method-assign]
    saver = Checkpointer(tmp_path, context=ONE, device=CPU, config=settings, control=control)
    saved_sha = params_sha256(state.module)
    saver.save(state, final=False)
    trained(state)  # the next step changes the live shards: the write has its own copy
    assert params_sha256(state.module) != saved_sha
    stepped.set()
    saver.drain(1)
    path = shards.path_for(tmp_path, 1)
    assert shards.check(path, rank=0, world_size=1) is None
    assert tensors_sha256(shards.whole_model(path)) == saved_sha
    assert {name for _, _, name in threads} == {"trainbox-checkpoint-1"}
    assert [point for point, _, _ in threads] == ["open", "write", "fsync", "sidecar", "rename",
                                                  "latest"]  # fmt: skip
    saver.save(state, final=True)  # the last one is written in the foreground, then pruned
    assert {name for _, step, name in threads if step == 2} == {threading.current_thread().name}
    assert shards.existing(tmp_path) == [shards.path_for(tmp_path, 2)]
    assert schema.read_file(shards.path_for(tmp_path, 2),
                            shards.read_record(shards.path_for(tmp_path, 2))).step == 2  # fmt: skip
    saver.close()
