"""Shared pieces of the recovery-library benchmarks: the model, the data, the reference loop.

A plain torch.distributed DDP loop on gloo (no library), the side every library's per-step cost is
measured against. Workers print one JSON line per event on stdout; `Worker` reads them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
from torch import nn

WIDTH, DEPTH, BATCH = 256, 4, 32


def model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


def batch(step: int, shard: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch for (step, shard) in every process and every run."""
    g = torch.Generator().manual_seed(1_000_003 * step + shard)
    x = torch.randn(BATCH, WIDTH, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def sha(m: nn.Module) -> str:
    h = hashlib.sha256()
    for p in m.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


class Worker:
    """One child process; its JSON events land in `events` as they arrive."""

    def __init__(self, argv: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.events: list[dict] = []
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=open(f"/tmp/recovery-{name}.err", "w"),  # noqa: SIM115
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                ev = json.loads(line)
                ev["recv"] = time.time()
                self.events.append(ev)


def plain_worker(rank: int, world: int, steps: int, port: int) -> None:
    """Reference: torch DDP over gloo, no fault tolerance."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=30),
    )
    m = nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    for s in range(steps):
        x, y = batch(s, rank)
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        emit(ev="step", s=s, ok=True, t=time.time())
    emit(ev="done", sha=sha(m.module), step=steps)
    torch.distributed.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_plain(world: int, steps: int) -> list[Worker]:
    port = free_port()
    here = os.path.abspath(__file__)
    ws = [
        Worker([here, str(r), str(world), str(steps), str(port)], {}, f"plain{r}")
        for r in range(world)
    ]
    for w in ws:
        w.proc.wait(timeout=300)
        w.thread.join()
    return ws


def steps_per_s(ws: list[Worker], skip: int) -> float:
    """Steps per second on rank 0, after `skip` warm-up steps, committed steps only."""
    t = [e["t"] for e in ws[0].events if e["ev"] == "step" and e["ok"]]
    return (len(t) - 1 - skip) / (t[-1] - t[skip])


if __name__ == "__main__":
    plain_worker(*map(int, sys.argv[1:5]))


def kill_mid_step(victim: Worker, at: int, deadline: float) -> float:
    """SIGKILL `victim` half a median step after its step `at` ended; the time of the kill."""
    while not any(ev["s"] >= at for ev in victim.events if ev["ev"] == "step"):
        time.sleep(0.002)
        assert time.time() < deadline
        assert victim.proc.poll() is None
    # Mid-step: half a step after step `at` ended, from the victim's own step times.
    t = [ev["t"] for ev in victim.events if ev["ev"] == "step"]
    time.sleep(sorted(b - a for a, b in itertools.pairwise(t))[len(t) // 2 - 1] / 2)
    victim.proc.send_signal(signal.SIGKILL)
    return time.time()
