"""An elastic torchrun job (`--nnodes=1:2`, c10d rendezvous) whose nodes come and go: two real
torchrun agents on this machine, each standing for a node with one worker.

Node A starts alone and trains at world size 1. Node B then joins: A's agent sees it waiting and
stops its worker (SIGTERM: trainbox checkpoints and exits 143), and both re-form at world size 2
and resume. Once B has trained past a checkpoint, B's agent and worker are SIGKILLed, as a lost
node would be: A's worker sees its peer gone and exits, and A re-forms alone at world size 1,
resumes from the checkpoint made at world size 2, and finishes. One run serves every test here.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from freeport import free_port
from runs import QUICK, clean_env, summary

pytestmark = pytest.mark.slow

STEPS = 120
# Rank 0 takes 60 ms more per step, so that node A alone is still training when B has started
# (about 7 s), and the kill lands mid-run.
CONFIG = [*QUICK, f"train.max_steps={STEPS}", "train.log_every=1", "dist.timeout_s=20"]
FAULT = {"TRAINBOX_FAULT": "slow:rank=0:ms=60"}
# Steps node B trains before it is killed: past at least one checkpoint (train.ckpt_every=7).
B_TRAINS = 10
# The rendezvous closes a round 1 s after enough nodes are in, and drops a node that missed its
# keep-alive for 5 s (defaults: 30 s and 15 s). A node beats only every one to two intervals, so
# fewer than three missed beats would drop a live node. Node A hosts the rendezvous store.
RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5"
# torch 2.13's agents publish the workers' store address for the first round only, so a node
# joining a later round waits for it for ever; without the shared store each round publishes
# its own (docs/reliability.md, Elastic runs).
UNSHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ElasticRun:
    """What the join-then-leave run left behind."""

    # The run directory both nodes trained into.
    run_dir: Path
    # Node A's exit code (its agent's).
    a_code: int
    # Node B's agent's exit code (killed: -9).
    b_code: int
    # The JSON log events of node A's workers, in order.
    a_events: list[dict[str, Any]]
    # The last step node B's worker logged before it was killed.
    b_killed_at: int
    # The tail of both nodes' stderr, for failure messages.
    tail: str


def agent(run_dir: Path, port: int, *, hosts_store: bool) -> subprocess.Popen[str]:
    """One node: a torchrun agent with one worker, in a session of its own (killable whole)."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=elastic-test",
        f"--rdzv-conf=is_host={int(hosts_store)},{RDZV_CONF}",
        "--max-restarts=3",
        "-m",
        "trainbox",
        "run",
        f"run_dir={run_dir}",
        *CONFIG,
    ]
    env = clean_env(PYTHONUNBUFFERED="1", **FAULT, **UNSHARED_STORE)
    return subprocess.Popen(
        argv, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON log events among a node's stderr lines."""
    for line in lines:
        if line.startswith("{"):
            yield json.loads(line)


def drain(stream: IO[str], into: queue.Queue[str | None]) -> None:
    """Every line of `stream` into `into`, then None."""
    for line in stream:
        into.put(line)
    into.put(None)


def until_step(lines: Iterator[str], seen: list[str], *, after: int | None = None) -> int:
    """Read until a worker logs a step (the `after`-th step past its first); returns it."""
    first = None
    for event in events(_recording(lines, seen)):
        if event.get("event") != "step":
            continue
        first = event["step"] if first is None else first
        if after is None or event["step"] >= first + after:
            return int(event["step"])
    raise AssertionError(f"no step logged\n{''.join(seen)[-3000:]}")


def _recording(lines: Iterator[str], seen: list[str]) -> Iterator[str]:
    for line in lines:
        seen.append(line)
        yield line


def _queued(into: queue.Queue[str | None]) -> Iterator[str]:
    while (line := into.get(timeout=240)) is not None:
        yield line


def _kill_node(node: subprocess.Popen[str], worker_pid: int | None) -> None:
    """SIGKILL a node's agent and its worker (torchrun gives each worker a session of its own)."""
    for group in (node.pid, worker_pid):
        if group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


@pytest.fixture(scope="module")
def elastic_run(tmp_path_factory: pytest.TempPathFactory) -> ElasticRun:
    run_dir, port = tmp_path_factory.mktemp("elastic") / "run", free_port()
    node_a = agent(run_dir, port, hosts_store=True)
    node_b: subprocess.Popen[str] | None = None
    worker_b: int | None = None
    assert node_a.stderr is not None
    a_lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=drain, args=(node_a.stderr, a_lines), daemon=True).start()
    a_seen: list[str] = []
    b_seen: list[str] = []
    try:
        # A trains alone; B joins once A has taken a step.
        until_step(_queued(a_lines), a_seen)
        node_b = agent(run_dir, port, hosts_store=False)
        assert node_b.stderr is not None
        b_lines = iter(node_b.stderr)
        killed_at = until_step(b_lines, b_seen, after=B_TRAINS)
        worker_b = next(
            e["pid"] for e in events(iter(reversed(b_seen))) if e.get("event") == "step"
        )
        _kill_node(node_b, worker_b)
        b_code = node_b.wait(timeout=60)
        b_seen.extend(b_lines)
        a_code = node_a.wait(timeout=240)
        a_seen.extend(_queued(a_lines))
    finally:
        for node in (node_a, node_b):
            if node is not None and node.poll() is None:
                _kill_node(node, None)
                node.wait()
    return ElasticRun(
        run_dir=run_dir,
        a_code=a_code,
        b_code=b_code,
        a_events=list(events(iter(a_seen))),
        b_killed_at=killed_at,
        tail=f"node A:\n{''.join(a_seen)[-3000:]}\nnode B:\n{''.join(b_seen)[-2000:]}",
    )


def world_changes(run: ElasticRun) -> list[tuple[int, int]]:
    """(checkpoint's world size, new world size) of every resume at another size, in order."""
    return [
        (e["checkpoint_world_size"], e["world_size"])
        for e in run.a_events
        if e.get("event", "").startswith("world size changed since the checkpoint")
    ]


def test_the_surviving_node_finishes_the_run_alone(elastic_run: ElasticRun) -> None:
    assert elastic_run.b_code == -signal.SIGKILL, elastic_run.tail
    assert elastic_run.a_code == 0, elastic_run.tail
    done = summary(elastic_run.run_dir)
    assert (done["steps"], done["world_size"]) == (STEPS, 1), elastic_run.tail


def test_a_joining_node_reforms_the_group_at_the_larger_size(elastic_run: ElasticRun) -> None:
    # The join is a membership change, not a failure: A's worker stops with a checkpoint.
    assert world_changes(elastic_run)[0] == (1, 2), elastic_run.tail


def test_after_the_leave_the_survivor_resumes_from_a_checkpoint_made_at_size_2(
    elastic_run: ElasticRun,
) -> None:
    assert world_changes(elastic_run) == [(1, 2), (2, 1)], elastic_run.tail
    resumed = [e for e in elastic_run.a_events if e.get("event") == "resumed"]
    assert resumed[-1]["step"] <= elastic_run.b_killed_at, elastic_run.tail
    manifest = json.loads((elastic_run.run_dir / "run.json").read_text())
    assert manifest["launch"]["world_size"] == 1
    assert manifest["resumed_from"] == resumed[-1]["checkpoint"]


def test_metrics_record_the_world_size_of_every_step(elastic_run: ElasticRun) -> None:
    lines = (elastic_run.run_dir / "metrics.jsonl").read_text().splitlines()
    sizes = [r["world_size"] for r in map(json.loads, lines) if r["kind"] == "train"]
    assert len(sizes) == STEPS, elastic_run.tail
    runs = [size for at, size in enumerate(sizes) if at == 0 or sizes[at - 1] != size]
    assert runs == [1, 2, 1], elastic_run.tail
