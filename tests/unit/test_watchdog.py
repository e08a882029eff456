"""The hang watchdog: who is to blame (pure), and the thread that publishes and judges."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, ClassVar

import pytest
import structlog
import torch
import torch.distributed

from trainbox import watchdog
from trainbox.errors import DistributedError
from trainbox.runtime import group
from trainbox.watchdog import Beat, Blame

NOW = 1_000_000.0
INTERVAL = 1.0


def beat(
    rank: int,
    *,
    op: str = "the stop vote",
    step: int = 17,
    stuck_s: float = 0.5,
    age: float = 0.2,
    fell: str = "",
) -> Beat:
    return Beat(
        rank=rank,
        host=f"node{rank}",
        pid=1000 + rank,
        op=op,
        step=step,
        stuck_s=stuck_s,
        published=NOW - age,
        fell=fell,
    )


def judged(beats: dict[int, Beat | None], exited: frozenset[int] = frozenset()) -> Blame:
    return watchdog.verdict(beats, now=NOW, publish_s=INTERVAL, exited=exited)


@pytest.mark.parametrize(
    ("beats", "exited", "rank", "kind", "words"),
    [
        # A stalled rank: its peers wait in a collective, it has been in data loading longest.
        ({0: beat(0, op="gradient all-reduce", stuck_s=4), 1: beat(1, op="data loading", stuck_s=6)},
         frozenset(), 1, "stuck", "rank 1 (node1) made no progress for 6 s in data loading at step 17"),
        # Publication age counts too: a beat from 3 s ago that said 2 s stuck means 5 s now.
        ({0: beat(0, stuck_s=4, age=0.1), 1: beat(1, stuck_s=2, age=3)},
         frozenset(), 1, "stuck", "made no progress for 5 s"),
        # A beat that saw no stall proves none: beats come every interval, progress or not, so a
        # rank heard from 3 s ago in start-up may have trained since (it died after step 24).
        ({0: beat(0, stuck_s=4, fell="lost-peer"), 1: beat(1, op="start-up", step=0, stuck_s=0.1, age=3)},
         frozenset(), 1, "stuck", "rank 1 (node1) last reported start-up at step 0, 3 s ago,"
         " and no failure since"),
        # A peer whose heartbeat went quiet is gone, whatever the others say.
        ({0: beat(0, stuck_s=9), 1: beat(1, age=30)},
         frozenset(), 1, "silent", "rank 1 (node1) stopped sending heartbeats 30 s ago"),
        ({0: beat(0), 1: None}, frozenset(), 1, "silent", "rank 1 never sent a heartbeat"),
        # A process on this host that is known to have exited beats any stuck one.
        ({0: beat(0, stuck_s=9), 1: beat(1), 2: beat(2)},
         frozenset({1}), 1, "exited", "rank 1 (node1) is gone: its process exited"),
        # Of the gone ranks, the one heard from last earliest failed first.
        ({0: beat(0, stuck_s=9), 1: beat(1), 2: beat(2, age=30)},
         frozenset({1}), 2, "silent", "rank 2 (node2) stopped sending heartbeats 30 s ago"),
        ({0: beat(0, stuck_s=9), 1: beat(1, age=3), 2: beat(2, age=1)},
         frozenset({1, 2}), 1, "exited", "rank 1 (node1) is gone"),
        # A rank that exited after saying it lost a peer is a victim of the cascade, not its cause.
        ({0: beat(0, stuck_s=9), 1: beat(1, fell="lost-peer"), 2: beat(2, age=1)},
         frozenset({1, 2}), 2, "exited", "rank 2 (node2) is gone"),
        ({0: None, 1: None}, frozenset(), 0, "silent", "rank 0 never sent a heartbeat"),
        ({}, frozenset(), None, "unknown", "no rank's heartbeat could be read"),
    ],
)  # fmt: skip
def test_verdict(
    beats: dict[int, Beat | None], exited: frozenset[int], rank: int | None, kind: str, words: str
) -> None:
    blame = judged(beats, exited)
    assert (blame.rank, blame.kind) == (rank, kind)
    assert words in blame.text


@pytest.mark.parametrize(
    ("beats", "exited", "host", "died"),
    [
        ({0: beat(0, stuck_s=9), 1: beat(1), 2: beat(2)}, frozenset({1}), "node1", True),
        ({0: beat(0, stuck_s=9), 1: beat(1, age=30)}, frozenset(), "node1", True),
        # Gone without a heartbeat: no host to name, so no node can be excluded.
        ({0: beat(0), 1: None}, frozenset(), "", False),
        # Stuck is not dead: the host is named, but the rank may yet be waiting on another.
        ({0: beat(0, stuck_s=4), 1: beat(1, stuck_s=6)}, frozenset(), "node1", False),
    ],
    ids=["exited", "silent", "never-heard", "stuck"],
)
def test_a_verdict_names_the_blamed_host_and_whether_its_rank_died(
    beats: dict[int, Beat | None], exited: frozenset[int], host: str, died: bool
) -> None:
    blame = judged(beats, exited)
    assert (blame.host, blame.died) == (host, died)


def test_ties_blame_the_lowest_rank() -> None:
    assert judged({2: beat(2, stuck_s=5), 1: beat(1, stuck_s=5)}).rank == 1


@pytest.mark.parametrize(("timeout", "interval"), [(600, 10.0), (30, 6.0), (5, 1.0), (1, 0.5)])
def test_heartbeats_go_out_well_within_the_timeout(timeout: float, interval: float) -> None:
    assert watchdog.interval_for(timeout) == interval


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation",
            True,
        ),
        ("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4481", True),
        ("NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error", True),
        # gloo's word for a pair it closed after an earlier timeout on it (seen from backward).
        ("Application timeout caused pair closure", True),
        ("mat1 and mat2 shapes cannot be multiplied (64x3 and 2x512)", False),
    ],
)
def test_transport_failures_are_told_from_user_errors(message: str, expected: bool) -> None:
    assert watchdog.is_comm_failure(RuntimeError(message)) is expected
    assert watchdog.is_comm_failure(ValueError(message)) is False


class DictStore:
    """The TCPStore calls the watchdog makes, over a dict (the real store: tests/dist and
    benchmarks/store_load.py). Counts the requests, as the store would see them."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.requests = 0
        self._lock = threading.Lock()

    def set(self, key: str, value: str) -> None:
        self.requests += 1
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        self.requests += 1
        return self.data[key]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.requests += 1
        return [self.data[key] for key in keys]

    def check(self, keys: list[str]) -> bool:
        self.requests += 1
        return all(key in self.data for key in keys)

    def add(self, key: str, amount: int) -> int:
        self.requests += 1
        with self._lock:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
        return value

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self.requests += 1
        with self._lock:
            if key not in self.data and expected == "":
                self.data[key] = desired.encode()
            return self.data[key]

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self.requests += 1
        give_up = time.monotonic() + timeout.total_seconds()
        while not all(key in self.data for key in keys):
            if time.monotonic() > give_up:
                raise TimeoutError("wait timed out")
            time.sleep(0.01)


def make(
    store: DictStore, *, rank: int = 0, timeout_s: float = 0.5, verdicts: list[str] | None = None
) -> watchdog.Watchdog:
    hung = threading.Event()

    def on_hang(message: str) -> None:
        if verdicts is not None:
            verdicts.append(message)
        hung.set()

    dog = watchdog.Watchdog(
        rank=rank, world_size=2, host="here", timeout_s=timeout_s, store=store, on_hang=on_hang
    )
    dog.hung = hung  # type: ignore[attr-defined]
    return dog


def test_entering_publishes_this_ranks_beat_at_once() -> None:
    store = DictStore()
    with make(store, timeout_s=600) as dog:
        dog.mark("evaluation", 40)
    published = json.loads(store.data[f"{watchdog.PREFIX}0"])
    assert (published["rank"], published["pid"], published["op"]) == (0, os.getpid(), "start-up")


def publish(store: DictStore, **fields: object) -> None:
    """Put a peer's heartbeat in the store, as its watchdog thread would."""
    beat = {
        "host": "elsewhere",
        "pid": 1,
        "op": "the stop vote",
        "step": 3,
        "stuck_s": 0.0,
        "published": time.time(),
        **fields,
    }
    store.set(f"{watchdog.PREFIX}{beat['rank']}", json.dumps(beat))


def test_a_stuck_main_thread_is_judged_and_named() -> None:
    store, verdicts = DictStore(), []
    # Rank 1 lives on another host and keeps publishing (here: a beat from the future).
    publish(store, rank=1, published=time.time() + 60)
    dog = make(store, verdicts=verdicts)
    with dog:
        dog.mark("data loading", 3)
        assert dog.hung.wait(timeout=30)  # type: ignore[attr-defined]
    assert len(verdicts) == 1
    assert verdicts[0].startswith("rank 0 (here) made no progress for ")
    assert "in data loading at step 3 (dist.timeout_s=0.5)" in verdicts[0]


def test_a_rank_waiting_on_a_stuck_peer_names_the_peer() -> None:
    store, verdicts = DictStore(), []
    publish(store, rank=1, op="data loading", step=3, stuck_s=100.0, published=time.time() + 60)
    dog = make(store, verdicts=verdicts)
    with dog:
        dog.mark("the stop vote", 3)
        assert dog.hung.wait(timeout=30)  # type: ignore[attr-defined]
    assert verdicts[0].startswith("rank 0 waited ")
    assert "in the stop vote at step 3; rank 1 (elsewhere) made no progress for " in verdicts[0]


def test_a_dead_peer_on_this_host_is_named() -> None:
    # A real process that has exited: its pid is free, as a SIGKILLed rank's would be.
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    store, told = DictStore(), []
    dog = make(store, timeout_s=600)
    dog.on_verdict = told.append
    with dog:
        publish(store, rank=1, host="here", pid=int(gone.stdout), op="data loading", step=9)
        explained = dog.explain("Connection closed by peer [127.0.0.1]:4481")
    # The verdict went through the store and back with its host: what the recorder is told.
    assert [(b.rank, b.kind, b.host) for b in told] == [(1, "exited", "here")]
    assert explained.startswith("rank 0 failed in start-up at step 0 (Connection closed by peer")
    assert (
        "rank 1 (here) is gone: its process exited; its last heartbeat said data loading at step 9"
        in explained
    )


def test_a_killed_peer_not_yet_reaped_counts_as_gone() -> None:
    # torchrun reaps a SIGKILLed worker only when it next looks: until then it is a zombie.
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, deliberately not reaped
    store = DictStore()
    publish(store, rank=1, host="here", pid=zombie.pid, op="data loading", step=9)
    dog = make(store, timeout_s=600)
    assert dog.blame_now().kind == "exited"
    zombie.wait()


class GoneStore(DictStore):
    """A store whose host (rank 0, or torchrun's agent) has exited."""

    def check(self, keys: list[str]) -> bool:
        del keys
        raise ConnectionError("connection refused")


def test_when_the_store_is_gone_a_stuck_rank_blames_only_itself() -> None:
    dog = make(GoneStore(), rank=1, timeout_s=600)
    dog.mark("data loading", 11)
    blame = dog.blame_now()
    assert (blame.rank, blame.kind) == (1, "stuck")
    assert "data loading at step 11" in blame.text


class BrokenPipeLogger:
    """Where log lines go once stderr's reader is gone (a killed launcher): every write fails."""

    def msg(self, *_args: object, **_kwargs: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    debug = info = warning = error = msg


def test_a_stuck_rank_still_ends_when_its_log_line_cannot_be_written() -> None:
    # A launcher killed with the pipe it read stderr from: a rank whose watchdog thread died on
    # its first log line would never exit.
    structlog.configure(logger_factory=lambda *_args: BrokenPipeLogger())
    verdicts: list[str] = []
    dog = make(DictStore(), verdicts=verdicts)
    with dog:
        dog.mark("evaluation", 40)
        assert dog.hung.wait(timeout=30)  # type: ignore[attr-defined]
    assert "in evaluation at step 40" in verdicts[0]


class BrokenPipeStream(io.StringIO):
    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_hung_process_exits_4_even_when_its_error_line_cannot_be_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exits: list[int] = []
    monkeypatch.setattr(sys, "stderr", BrokenPipeStream())
    monkeypatch.setattr(os, "_exit", exits.append)
    with pytest.raises(BrokenPipeError):
        group._die_of_hang("rank 0 made no progress for 600 s in evaluation at step 40")
    assert exits == [4]


@pytest.mark.parametrize(
    ("timeout", "world", "every"),
    [(600, 8, 10.0), (600, 1500, 10.0), (600, 4096, 4096 / 150), (20, 256, 4.0), (20, 1024, 1024 / 150)],
)  # fmt: skip
def test_heartbeats_are_spread_so_the_store_sees_at_most_150_writes_a_second(
    timeout: float, world: int, every: float
) -> None:
    assert watchdog.publish_every(timeout, world) == pytest.approx(every)
    assert world / watchdog.publish_every(timeout, world) <= 150.0 or every == 10.0


@pytest.mark.parametrize(
    ("beats", "exited", "rank", "final"),
    [
        # Every other rank gave up as a victim: the one still standing (on another host, its
        # beat still fresh) failed first.
        ({0: beat(0, fell="lost-peer"), 1: beat(1, stuck_s=1), 2: beat(2, fell="lost-peer")},
         frozenset(), 1, True),
        # The one still standing last beat before any stall: it may have died since (a pod
        # killed on another node), which only its silence will show, so the verdict waits.
        ({0: beat(0, fell="lost-peer"), 1: beat(1, stuck_s=0.3)}, frozenset(), 1, False),
        # Two ranks still run: more may give up yet, so the verdict can still change.
        ({0: beat(0, fell="lost-peer"), 1: beat(1, stuck_s=1), 2: beat(2, stuck_s=3)},
         frozenset(), 2, False),
        # All gave up after their own watchdog fired: the one stuck longest stalled first.
        ({0: beat(0, fell="stuck", stuck_s=8), 1: beat(1, fell="stuck", stuck_s=9, age=0),
          2: beat(2, fell="stuck", stuck_s=8)}, frozenset(), 1, True),
        # A victim that exited is not gone for the verdict; the one that never said a word is.
        ({0: beat(0, fell="lost-peer"), 1: beat(1, fell="lost-peer"), 2: beat(2, age=0.5)},
         frozenset({0, 2}), 2, True),
    ],
)  # fmt: skip
def test_the_rank_that_failed_first_is_named_not_a_victim_of_the_cascade(
    beats: dict[int, Beat | None], exited: frozenset[int], rank: int, final: bool
) -> None:
    blame = judged(beats, exited)
    assert (blame.rank, blame.final) == (rank, final)


@pytest.mark.parametrize(
    ("error", "short"),
    [
        ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed"
         " by peer [127.0.0.1]:18639. This is typically caused by a remote worker crashing. Check"
         " the logs of the remote worker before reporting an error. GLHF! 🏖️",
         "Connection closed by peer [127.0.0.1]:18639"),
        ("[/x/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv"
         " operation to complete", "Timed out waiting 10000ms for recv operation to complete"),
        ("Application timeout caused pair closure", "Application timeout caused pair closure"),
        ("x" * 300, "x" * 97 + "..."),
        ("", "no message"),
    ],
)  # fmt: skip
def test_a_transport_error_is_cut_to_what_happened(error: str, short: str) -> None:
    assert watchdog.short_error(error) == short


def ignore(message: str) -> None:
    del message


def test_a_cascade_gets_one_verdict_from_a_few_judges_in_o1_requests_per_rank() -> None:
    world, dead = 48, 29
    store = DictStore()
    dogs = [
        watchdog.Watchdog(
            rank=rank,
            world_size=world,
            host="here",
            timeout_s=600,
            store=store,
            on_hang=ignore,
        )
        for rank in range(world)
        if rank != dead
    ]
    for dog in dogs:
        dog._publish()
    # The dead rank lives on another host and said its last word long ago.
    publish(store, rank=dead, op="data loading", step=8, published=time.time() - 3600)
    before = store.requests
    said: dict[int, str] = {}

    def fail(dog: watchdog.Watchdog) -> None:
        said[dog.rank] = dog.explain("Connection closed by peer [127.0.0.1]:4481")

    threads = [threading.Thread(target=fail, args=(dog,)) for dog in dogs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(said) == world - 1
    assert all(
        f"rank {dead} (elsewhere) stopped sending heartbeats" in line for line in said.values()
    )
    # Give up, count, judge or wait, get, told: a handful each, not one per peer.
    assert store.requests - before <= 8 * (world - 1)


class RecordingTCPStore:
    """torch's TCPStore client as the watchdog builds it: which timeouts it was given."""

    made: ClassVar[list[RecordingTCPStore]] = []
    refuse: ClassVar[bool] = False

    def __init__(self, *where: object, **options: Any) -> None:
        del where  # host and port
        if RecordingTCPStore.refuse:
            raise torch.distributed.DistNetworkError("The client socket has timed out")
        self.connect_timeout = options["timeout"]
        self.op_timeout = options["timeout"]
        RecordingTCPStore.made.append(self)

    def set_timeout(self, timeout: timedelta) -> None:
        self.op_timeout = timeout


@pytest.fixture
def recording_store(monkeypatch: pytest.MonkeyPatch) -> type[RecordingTCPStore]:
    monkeypatch.setattr(RecordingTCPStore, "made", [])
    monkeypatch.setattr(torch.distributed, "TCPStore", RecordingTCPStore)
    monkeypatch.setattr(torch.distributed, "PrefixStore", lambda _prefix, store: store)
    return RecordingTCPStore


@pytest.mark.parametrize(("timeout", "connect", "ask"), [(600, 600, 5), (20, 30, 5), (2, 30, 2)])
def test_the_watchdog_connects_patiently_and_then_asks_briefly(
    recording_store: type[RecordingTCPStore], timeout: float, connect: float, ask: float
) -> None:
    # 48 ranks connecting at once on a loaded machine waited over 5 s for the store, and the
    # run died of the watchdog's own connection; a dead store must still not block a beat long.
    watchdog.connect("m", 1234, world_size=48, timeout_s=timeout, attempt="0-w48")
    (made,) = recording_store.made
    assert (made.connect_timeout, made.op_timeout) == (
        timedelta(seconds=connect),
        timedelta(seconds=ask),
    )


def test_a_store_that_cannot_be_reached_is_a_distributed_error_naming_it(
    recording_store: type[RecordingTCPStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recording_store, "refuse", True)
    with pytest.raises(DistributedError, match=r"m:1234") as caught:
        watchdog.connect("m", 1234, world_size=48, timeout_s=600, attempt="0-w48")
    assert caught.value.exit_code == 4
    assert "GLHF" not in caught.value.line()
