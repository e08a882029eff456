"""eval, predict and export read a sharded checkpoint whole into an unsharded model, in one
process, with or without a process group, and name what does not fit or is damaged.

A real gloo group of one (in-memory store) and real DCP files; tests/dist/test_fsdp.py reads a
two-rank checkpoint at other world sizes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict

from trainbox.checkpoint import schema, shards
from trainbox.checkpoint.schema import Payload
from trainbox.commands.export import export, problems
from trainbox.errors import UsageError
from trainbox.infer.model import load_weights, sharded_problem
from trainbox.tasks.mlp import mlp
from trainbox.train.parallel.fsdp import wrap
from trainbox.train.resume.state import tensors_sha256

from runs import clean_env

CPU = torch.device("cpu")


@pytest.fixture
def world_of_one() -> Iterator[None]:
    # An in-memory store: a real gloo group with no port and nothing left behind.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def saved(directory: Path) -> tuple[Path, str]:
    """A one-rank fsdp checkpoint of a small MLP after an AdamW step, and its params_sha256."""
    torch.manual_seed(0)
    model = mlp(in_features=3, out_features=2, hidden=5, layers=2)
    wrap(model, CPU, world_size=1, amp_dtype=None, units=None)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    tensors = dict(zip((shards.MODEL, "optimizer"), get_state_dict(model, optimizer), strict=True))
    record = Payload(step=1, model={}, optimizer={}, sharded=True).to_dict()
    path = shards.save(directory, 1, tensors, record=record, device=CPU)
    return path, tensors_sha256(model.state_dict())


def payload(path: Path) -> Payload:
    return schema.read_file(path, shards.read_record(path))


@pytest.mark.parametrize("group", [True, False], ids=["in-a-group", "no-group"])
def test_a_sharded_checkpoint_loads_whole_into_an_unsharded_model(
    world_of_one: None, tmp_path: Path, group: bool
) -> None:
    del world_of_one
    path, fingerprint = saved(tmp_path)
    if not group:
        dist.destroy_process_group()
    torch.manual_seed(1)  # other initial weights
    model = mlp(in_features=3, out_features=2, hidden=5, layers=2)
    load_weights(model, path, payload(path))
    assert tensors_sha256(model.state_dict()) == fingerprint


def test_its_layout_on_the_meta_device_has_every_shape_and_no_memory(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    path, _ = saved(tmp_path)
    layout = shards.model_layout(path, torch.device("meta"))
    model = mlp(in_features=3, out_features=2, hidden=5, layers=2)
    assert {key: value.shape for key, value in layout.items()} == {
        key: value.shape for key, value in model.state_dict().items()
    }
    assert {value.device.type for value in layout.values()} == {"meta"}


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: mlp(in_features=3, out_features=2, hidden=6, layers=2), "shapes differ: 0.weight"),
        (lambda: mlp(in_features=3, out_features=2, hidden=5, layers=3), "missing from the"),
        (lambda: mlp(in_features=3, out_features=2, hidden=5, layers=1), "not in the model: 4."),
    ],
    ids=["wider", "deeper", "shallower"],
)
def test_a_model_the_shards_do_not_fit_is_refused_naming_the_tensors(
    world_of_one: None, tmp_path: Path, build: Callable[[], torch.nn.Module], named: str
) -> None:
    del world_of_one
    path, _ = saved(tmp_path)
    with pytest.raises(RuntimeError, match=named):
        load_weights(build(), path, payload(path))


def test_a_damaged_shard_is_named_before_anything_loads(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    path, _ = saved(tmp_path)
    assert sharded_problem(path, path, readable=True) is None
    (path / "__0_0.distcp").write_bytes(b"torn")
    problem = sharded_problem(path, path, readable=True)
    assert problem is not None
    assert "__0_0.distcp does not match its checksum" in problem.text
    assert "older checkpoint" in problem.hint


def test_a_checkpoint_file_is_not_checked_as_shards(world_of_one: None, tmp_path: Path) -> None:
    del world_of_one
    (tmp_path / "step-00000001.pt").write_bytes(b"not read here")
    assert sharded_problem(tmp_path, tmp_path / "step-00000001.pt", readable=True) is None


def test_export_writes_the_models_state_dict_with_the_runs_fingerprint(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    path, fingerprint = saved(tmp_path / "checkpoints")
    dist.destroy_process_group()  # export needs none
    line = export(path, tmp_path / "out" / "model.pt")
    model = mlp(in_features=3, out_features=2, hidden=5, layers=2)
    model.load_state_dict(torch.load(tmp_path / "out" / "model.pt", weights_only=True))
    assert tensors_sha256(model.state_dict()) == fingerprint
    assert line.startswith("exported the model of step 1 (6 tensors, ")
    assert line.endswith(f"to {tmp_path / 'out' / 'model.pt'}: params_sha256={fingerprint}")
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_export_refuses_a_damaged_checkpoint_and_writes_nothing(
    world_of_one: None, tmp_path: Path
) -> None:
    del world_of_one
    path, _ = saved(tmp_path)
    (path / "__0_0.distcp").write_bytes(b"torn")
    with pytest.raises(UsageError, match=r"__0_0\.distcp does not match its checksum"):
        export(path, tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize(
    ("checkpoint", "output", "force", "named"),
    [
        ("nowhere", "model.pt", False, "--checkpoint '{tmp}/nowhere' does not exist"),
        ("step-00000001.pt", "model.pt", False, "is a one-file checkpoint"),
        ("step-00000001.dcp", "taken.pt", False, "--output '{tmp}/taken.pt' already exists"),
        ("step-00000001.dcp", "", False, "--output '{tmp}' is a directory"),
    ],
)
def test_export_names_every_bad_path_before_reading_anything(
    tmp_path: Path, checkpoint: str, output: str, force: bool, named: str
) -> None:
    (tmp_path / "step-00000001.dcp").mkdir()
    (tmp_path / "step-00000001.dcp" / shards.MANIFEST).write_text("{}")
    (tmp_path / "step-00000001.pt").write_bytes(b"")
    (tmp_path / "taken.pt").write_bytes(b"kept")
    found = problems(tmp_path / checkpoint, tmp_path / output, force=force)
    assert [problem.text for problem in found if named.format(tmp=tmp_path) in problem.text]
    assert len(found) == 1
    assert (tmp_path / "taken.pt").read_bytes() == b"kept"


def test_export_may_replace_an_existing_output_with_force(tmp_path: Path) -> None:
    (tmp_path / "step-00000001.dcp").mkdir()
    (tmp_path / "step-00000001.dcp" / shards.MANIFEST).write_text("{}")
    (tmp_path / "taken.pt").write_bytes(b"old")
    assert problems(tmp_path / "step-00000001.dcp", tmp_path / "taken.pt", force=True) == []


def test_export_of_a_bad_path_exits_2_with_one_line_and_a_hint(tmp_path: Path) -> None:
    argv = ["export", "--checkpoint", str(tmp_path / "nowhere"), "--output", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-m", "trainbox", *argv], env=clean_env(),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(
        f"trainbox: error: --checkpoint '{tmp_path / 'nowhere'}' does not"
    )
    assert f"--output '{tmp_path}' is a directory. HINT: " in proc.stderr
