"""Samples of any nesting become batches: dataclasses too, and today's samples exactly as before."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, default_collate

from trainbox.train.data.batches import collate
from trainbox.train.data.map_style import eval_loader
from trainbox.train.evaluate import evaluate, step_of


class Pair(NamedTuple):
    inputs: torch.Tensor
    target: torch.Tensor


@dataclass(frozen=True)
class Clip:
    frames: torch.Tensor
    label: torch.Tensor
    source: str = "synthetic"


def clip(index: int) -> Clip:
    return Clip(frames=torch.full((2, 3), float(index)), label=torch.tensor(index % 2))


def test_dataclass_samples_are_stacked_field_by_field() -> None:
    batch = collate([clip(0), clip(1), clip(2)])
    assert isinstance(batch, Clip)
    assert batch.frames.shape == (3, 2, 3)
    assert batch.label.tolist() == [0, 1, 0]
    assert batch.source == ["synthetic"] * 3


def test_dataclasses_inside_dicts_and_namedtuples() -> None:
    samples = [{"clip": clip(i), "pair": Pair(torch.ones(2), torch.tensor(i))} for i in range(2)]
    batch = collate(samples)
    assert isinstance(batch["clip"], Clip)
    assert isinstance(batch["pair"], Pair)
    assert batch["clip"].frames.shape == (2, 2, 3)
    assert batch["pair"].target.tolist() == [0, 1]


@pytest.mark.parametrize(
    "samples",
    [
        [(torch.ones(3), torch.tensor(1)), (torch.zeros(3), torch.tensor(0))],
        [{"x": torch.ones(2), "meta": {"id": 4}}, {"x": torch.zeros(2), "meta": {"id": 5}}],
        [Pair(torch.ones(2), torch.tensor(0))] * 2,
    ],
    ids=["pair", "dict", "namedtuple"],
)
def test_samples_without_dataclasses_collate_as_torch_does(samples: list[Any]) -> None:
    ours, torchs = collate(samples), default_collate(samples)
    assert type(ours) is type(torchs)
    assert repr(ours) == repr(torchs)


class Clips(torch.utils.data.Dataset[Clip]):
    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> Clip:
        return clip(index)


def frame_sum(_model: torch.nn.Module, batch: Clip) -> dict[str, tuple[Any, Any]]:
    return {"frame": (batch.frames.sum(), batch.frames.numel()), "odd": (batch.label.sum(), 1)}


def test_dataclass_batches_through_sharded_evaluation() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        got = evaluate(
            torch.nn.Identity(),
            eval_loader(Clips(), rank=0, world_size=1, batch_size=2, num_workers=0),
            step=step_of(frame_sum),
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext(),
            slots=3,
        )
    finally:
        dist.destroy_process_group()
    # Frames hold their index: (0+1+2+3+4) * 6 / 30; `odd` counts once per batch (3 batches).
    assert got == {"val_frame": 2.0, "val_odd": 2 / 3, "val_samples": 5}


def test_a_plain_loader_would_refuse_them() -> None:
    with pytest.raises(TypeError):
        next(iter(DataLoader(Clips(), batch_size=2)))
