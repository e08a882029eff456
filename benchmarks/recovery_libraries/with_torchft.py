"""torchft 0.2.0 against a plain DDP loop: recovery after a SIGKILL and per-step cost.

Run: PYTHONPATH=/tmp/libs-torchft .venv/bin/python benchmarks/recovery_libraries/with_torchft.py

Each process is its own replica group of size 1 (torchft's DDP model), with its own TCPStore and
Manager; one LighthouseServer in this (parent) process decides every step's quorum. torchft's
DistributedDataParallel averages gradients through Manager.allreduce and its Optimizer wrapper
steps only when Manager.should_commit() agrees, so a step that lost a peer is discarded and retried.

Recovery run: 5 replicas, WorldSizeMode.FIXED_WITH_SPARES, min_replica_size=4 (4 train, one
spare contributes zero gradients). Each step's data is chosen by (manager step, participating
rank), so a retried step and a spare taking over use the same batches as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plain_loop as rp


def worker() -> None:
    import torch
    from torch import nn
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    from torchft.manager import WorldSizeMode

    torch.set_num_threads(1)
    e = os.environ
    rid, steps, min_size = e["RID"], int(e["STEPS"]), int(e["MIN_SIZE"])
    mode = WorldSizeMode[e["MODE"]]
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    m = rp.model()
    opt_inner = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    def load_state_dict(sd: dict) -> None:
        m.load_state_dict(sd["model"])
        opt_inner.load_state_dict(sd["optim"])

    def state_dict() -> dict:
        return {"model": m.state_dict(), "optim": opt_inner.state_dict()}

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=float(e["PG_TIMEOUT_S"]))),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=min_size,
        world_size_mode=mode,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=e["LIGHTHOUSE"],
        replica_id=rid,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
    )
    # torchft.DistributedDataParallel's comm hook fails an assert when the allreduce lost a
    # peer (ddp.py:76 `assert fut._fut`, see README.md here), so by default the
    # gradients go through Manager.allreduce as one flat buffer after backward.
    wrapped = e["DDP"] == "wrapper"
    ddp = DistributedDataParallel(manager, m) if wrapped else m
    opt = Optimizer(manager, opt_inner)
    while manager.current_step() < steps:
        s = manager.current_step()
        opt.zero_grad()  # starts the quorum
        shard = manager.participating_rank()
        x, y = rp.batch(s, shard if shard is not None else 99)
        nn.functional.mse_loss(ddp(x), y).backward()
        if not wrapped:
            grads = [p.grad for p in m.parameters()]
            flat = torch.cat([g.flatten() for g in grads])
            manager.allreduce(flat).wait()  # errors are recorded, not raised
            for g, f in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(f.view_as(g))
        opt.step()  # commits only if every participant agrees
        rp.emit(ev="step", s=s, ok=manager.current_step() > s, t=time.time(), shard=shard)
    rp.emit(ev="done", sha=rp.sha(m), step=manager.current_step())
    manager.shutdown(wait=False)
    os._exit(0)


def run_ft(
    n: int,
    min_size: int,
    mode: str,
    steps: int,
    kill: tuple[str, int] | None,
    a: argparse.Namespace,
) -> dict:
    from torchft._torchft import LighthouseServer

    lh = LighthouseServer(
        bind="[::]:0",
        min_replicas=min_size,
        join_timeout_ms=a.join_ms,
        quorum_tick_ms=100,
        heartbeat_timeout_ms=a.heartbeat_ms,
    )
    here = os.path.abspath(__file__)
    env = {
        "LIGHTHOUSE": lh.address(),
        "STEPS": str(steps),
        "MIN_SIZE": str(min_size),
        "MODE": mode,
        "PG_TIMEOUT_S": str(a.pg_timeout_s),
        "DDP": a.ddp,
    }
    ws = {
        f"r{i}": rp.Worker([here, "--worker"], {**env, "RID": f"r{i}"}, f"ft-r{i}")
        for i in range(n)
    }
    killed_at = None
    deadline = time.time() + 600
    if kill:
        victim, at = kill
        killed_at = rp.kill_mid_step(ws[victim], at, deadline)
    for w in ws.values():
        w.proc.wait(timeout=max(1, deadline - time.time()))
        w.thread.join()
    lh.shutdown()
    out: dict = {"workers": {}}
    for rid, w in ws.items():
        steps_ev = [ev for ev in w.events if ev["ev"] == "step"]
        done = [ev for ev in w.events if ev["ev"] == "done"]
        out["workers"][rid] = {
            "rc": w.proc.returncode,
            "sha": done[0]["sha"] if done else None,
            "final_step": done[0]["step"] if done else None,
        }
        if killed_at is not None and rid != kill[0]:
            after = [ev for ev in steps_ev if ev["t"] > killed_at]
            first_ok = next(ev for ev in after if ev["ok"])
            out["workers"][rid].update(
                kill_to_next_step_s=first_ok["t"] - killed_at,
                steps_discarded=sum(1 for ev in after if not ev["ok"]),
                step_attempts_after_kill=[(ev["s"], ev["ok"], ev["shard"]) for ev in after[:4]],
            )
    if killed_at is None:
        out["steps_per_s"] = rp.steps_per_s([ws["r0"]], 10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill-at", type=int, default=30)
    ap.add_argument("--heartbeat-ms", type=int, default=5000)  # the lighthouse's default
    # The lighthouse waits this long for a replica that still heartbeats (default 60000).
    ap.add_argument("--join-ms", type=int, default=100)
    # torchft's ProcessGroupGloo timeout: how long a collective waits on a lost peer.
    ap.add_argument("--pg-timeout-s", type=float, default=10)
    ap.add_argument("--ddp", choices=["allreduce", "wrapper"], default="allreduce")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-recovery", action="store_true")
    a = ap.parse_args()
    result: dict = vars(a).copy()
    if not a.skip_recovery:
        ref = run_ft(5, 4, "FIXED_WITH_SPARES", a.steps, None, a)
        rec = run_ft(5, 4, "FIXED_WITH_SPARES", a.steps, ("r1", a.kill_at), a)
        ref_sha = {w["sha"] for w in ref["workers"].values()}
        rec_sha = {w["sha"] for rid, w in rec["workers"].items() if rid != "r1"}
        result["recovery"] = rec
        result["uninterrupted_sha"] = sorted(ref_sha)
        result["bit_exact"] = len(ref_sha) == 1 and rec_sha == ref_sha
        print(json.dumps(rec, indent=1), file=sys.stderr)
    if not a.skip_overhead:
        plain, ft = [], []
        for _ in range(a.reps):  # alternate the sides: A B A B
            plain.append(rp.steps_per_s(rp.run_plain(4, a.steps * 2), 10))
            ft.append(run_ft(4, 4, "DYNAMIC", a.steps * 2, None, a)["steps_per_s"])
        result.update(plain_steps_per_s=plain, torchft_steps_per_s=ft)
        result["ratio_median"] = sorted(f / p for f, p in zip(ft, plain, strict=True))[len(ft) // 2]
    print(json.dumps(result))


if __name__ == "__main__":
    worker() if sys.argv[1:] == ["--worker"] else main()
