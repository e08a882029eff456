"""Which process group generation a process joins after a rank is lost (distributed/regroup.py),
on torch's own in-memory store, which answers as the agent's TCPStore does."""

from __future__ import annotations

import json
import threading

import pytest
import torch
import torch.distributed as torch_dist

from trainbox.distributed import regroup
from trainbox.distributed.regroup import Generations


def generations(store: torch_dist.Store, *, rank: int = 1) -> Generations:
    return Generations(
        store, "trainbox/attempt-0-w4", rank=rank, world_size=4, backend="gloo", timeout_s=5,
        device=torch.device("cpu"),
    )  # fmt: skip


def registered(
    store: torch_dist.Store, pid: int, generation: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process `pid` of rank 1 says it joins `generation`."""
    monkeypatch.setattr(regroup.os, "getpid", lambda: pid)
    generations(store).register(generation)
    monkeypatch.undo()


def test_a_spare_whose_predecessors_never_joined_joins_the_first_generation() -> None:
    assert generations(torch_dist.HashStore()).target_for_spare((101,)) == 0


def test_a_spare_joins_where_the_survivors_still_wait_for_its_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = torch_dist.HashStore()
    registered(store, 101, 2, monkeypatch)
    # Generation 2 was neither formed nor given up on: the others still wait there.
    assert generations(store).target_for_spare((101,)) == 2


@pytest.mark.parametrize("moved_on", ["formed-2", "closed-2"])
def test_a_spare_joins_the_generation_after_the_one_its_predecessor_lost(
    monkeypatch: pytest.MonkeyPatch, moved_on: str
) -> None:
    store = torch_dist.HashStore()
    registered(store, 101, 2, monkeypatch)
    store.set(f"trainbox/attempt-0-w4/recovery/{moved_on}", "1")
    assert generations(store).target_for_spare((101,)) == 3


def test_the_newest_predecessor_that_joined_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    store = torch_dist.HashStore()
    registered(store, 101, 0, monkeypatch)
    registered(store, 102, 1, monkeypatch)
    store.set("trainbox/attempt-0-w4/recovery/formed-1", "1")
    # 103 died before it said where it was going: 102's generation was formed, so the next.
    assert generations(store).target_for_spare((101, 102, 103)) == 2


def test_another_ranks_predecessor_is_not_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    store = torch_dist.HashStore()
    registered(store, 101, 3, monkeypatch)
    assert generations(store, rank=2).target_for_spare((101,)) == 0


def test_generation_zero_meets_where_every_run_always_met() -> None:
    store = torch_dist.HashStore()
    generations(store).store(0).set("key", "first")
    generations(store).store(1).set("key", "second")
    assert store.get("trainbox/attempt-0-w4/key") == b"first"
    assert store.get("trainbox/attempt-0-w4/gen-1/key") == b"second"


def test_rank_0_reads_every_spares_news_of_a_generation() -> None:
    store = torch_dist.HashStore()
    for rank in (2, 3):
        joined = generations(store, rank=rank)
        joined.current = 4
        joined.announce(json.dumps({"rank": rank}))
    assert generations(store, rank=0).announcements(4) == [{"rank": 2}, {"rank": 3}]
    assert generations(store, rank=0).announcements(5) == []


def test_recoveries_add_up_across_processes() -> None:
    store = torch_dist.HashStore()
    generations(store, rank=0).count_recoveries(2)
    generations(store, rank=0).count_recoveries(1)
    assert generations(store, rank=3).recoveries() == 3


def test_a_generation_forms_only_once_every_rank_has_arrived() -> None:
    store = torch_dist.HashStore()
    early, late = generations(store, rank=0), generations(store, rank=1)
    early.world_size = late.world_size = 2
    waits: list[str] = []
    waiter = threading.Thread(target=early.arrive, args=(3, lambda: waits.append("rank 0")))
    waiter.start()
    # Rank 0 is still waiting: the last one to arrive lets everyone through.
    waiter.join(timeout=0.5)
    assert waiter.is_alive()
    late.arrive(3, lambda: waits.append("rank 1"))
    waiter.join()
    assert "rank 1" not in waits, "the last to arrive does not wait"


def test_a_join_that_fails_moves_on_to_the_next_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    # A peer lost while a generation forms fails it for everyone: all move on to the next one.
    store = torch_dist.HashStore()
    alone = generations(store, rank=0)
    alone.world_size = 1
    tried: list[int] = []

    def init(**_: object) -> None:
        tried.append(alone.current)
        if len(tried) == 1:
            raise RuntimeError("Gloo connectFullMesh failed with [...] Connection closed by peer")

    monkeypatch.setattr(regroup.torch_dist, "init_process_group", init)
    alone.join_first_formed(4, attempts=3)
    assert tried == [4, 5]
    assert store.check(["trainbox/attempt-0-w4/recovery/closed-4"])
    assert store.check(["trainbox/attempt-0-w4/recovery/formed-5"])


def test_joining_gives_up_after_its_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    alone = generations(torch_dist.HashStore(), rank=0)
    alone.world_size = 1

    def init(**_: object) -> None:
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(regroup.torch_dist, "init_process_group", init)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        alone.join_first_formed(0, attempts=2)
    assert alone.current == 1
