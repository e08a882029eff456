"""Decisions every rank takes together cost each rank O(1) traffic, whatever the world size.

At 4,096 ranks an all-gather hands every rank 4,096 records (an RNG state is ~5 kB: 20 MB per
rank per checkpoint, 80 GB across the job). Rank 0 gathers, judges and broadcasts instead; the
source is checked so that no all-gather of objects comes back.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as torch_dist

import trainbox
from trainbox.distributed import consensus

SOURCE = Path(trainbox.__file__).parent


def test_no_module_all_gathers_objects() -> None:
    found = [
        f"{path.relative_to(SOURCE)}:{node.lineno}"
        for path in sorted(SOURCE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "all_gather_object"
    ]
    assert found == [], "use trainbox.distributed.consensus: rank 0 gathers, judges and broadcasts"


class FakeGroup:
    """torch.distributed as seen by one rank of `world`: what it sent and received."""

    def __init__(self, rank: int, world: int, others: list[Any]) -> None:
        self.rank, self.world, self.others = rank, world, others
        self.received: list[Any] = []

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world

    def gather_object(
        self, obj: Any, object_gather_list: list[Any] | None, dst: int, group: object = None
    ) -> None:
        assert group is None  # the default group: the one every decision here is taken on
        assert (object_gather_list is not None) == (self.rank == dst)
        if object_gather_list is not None:
            object_gather_list[:] = [
                obj if r == self.rank else self.others[r] for r in range(self.world)
            ]
            self.received += object_gather_list

    def broadcast_object_list(self, box: list[Any], src: int, group: object = None) -> None:
        assert group is None
        if self.rank != src:
            box[:] = ["verdict from rank 0"]
        self.received += box


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, int, list[Any]], FakeGroup]:
    """Installs a FakeGroup as torch.distributed for the test (undone by monkeypatch)."""

    def install(rank: int, world: int, others: list[Any]) -> FakeGroup:
        fake = FakeGroup(rank, world, others)
        for name in ("get_rank", "get_world_size", "gather_object", "broadcast_object_list"):
            monkeypatch.setattr(torch_dist, name, getattr(fake, name))
        return fake

    return install


def test_rank0_judges_everyone_and_every_rank_gets_its_verdict(group: Any) -> None:
    fake = group(0, 4, ["a", "b", "c", "d"])
    assert consensus.decided_by_rank0("a", lambda everyone: "".join(everyone)) == "abcd"
    assert fake.received[:4] == ["a", "b", "c", "d"]


def test_another_rank_receives_only_the_verdict(group: Any) -> None:
    fake = group(3, 4096, [])
    judged: list[Any] = []
    assert consensus.decided_by_rank0("mine", judged.append) == "verdict from rank 0"
    assert (judged, fake.received) == ([], ["verdict from rank 0"])


def test_rank0_receives_every_rank_s_record(group: Any) -> None:
    group(0, 3, ["a", "b", "c"])
    assert consensus.to_rank0("a") == ["a", "b", "c"]


def test_another_rank_sends_its_record_and_receives_nothing(group: Any) -> None:
    fake = group(5, 4096, [])
    assert consensus.to_rank0("f") is None
    assert fake.received == []
