"""nvidia-resiliency-ext 0.4.1 in-process restart against a plain DDP loop.

Run: PYTHONPATH=/tmp/libs-nvrx .venv/bin/python benchmarks/recovery_libraries/with_nvrx.py

Five processes: nvrx's Wrapper keeps 4 ranks active and 1 inactive (a spare, in its reserve loop;
rank assignment MaxActiveWorldSize(4) after ShiftRanks). On a SIGKILL the Wrapper's monitors mark
the rank terminated, every survivor aborts its process group (AbortTorchDistributed) and calls
the wrapped function again with reassigned ranks, the spare now active. nvrx does not move
training state: the wrapped function keeps model, optimizer and step outside itself and, on each
(re)entry, takes the state of the furthest rank (all_gather of steps, broadcast_object_list of
torch.save bytes), as trainbox's hand-over does. Data is chosen by (step, rank); gradients
go through one flat all_reduce (DDP re-wrapped after a restart would bucket differently).
"""

import argparse
import datetime
import io
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import plain_loop as rp

T = datetime.timedelta


def worker() -> None:
    import nvidia_resiliency_ext.inprocess as inprocess
    import torch
    from nvidia_resiliency_ext.inprocess.rank_assignment import (
        ActivateAllRanks,
        MaxActiveWorldSize,
        ShiftRanks,
    )
    from torch import nn
    from torch.distributed import PrefixStore, TCPStore

    torch.set_num_threads(1)
    steps, active = int(os.environ["STEPS"]), int(os.environ["ACTIVE"])
    port = int(os.environ["MASTER_PORT"])
    fast = os.environ["TUNED"] == "1"
    m = rp.model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    held = {"step": 0, "store": None}

    def pack() -> bytes:
        buf = io.BytesIO()
        torch.save({"m": m.state_dict(), "o": opt.state_dict(), "s": held["step"]}, buf)
        return buf.getvalue()

    intervals = (
        dict(
            monitor_thread_interval=T(seconds=0.05),
            monitor_process_interval=T(seconds=0.05),
            heartbeat_interval=T(seconds=0.1),
            progress_watchdog_interval=T(seconds=0.05),
            heartbeat_timeout=T(seconds=2),
            last_call_wait=T(seconds=0.05),
            soft_timeout=T(seconds=10),
            hard_timeout=T(seconds=20),
            barrier_timeout=T(seconds=60),
            completion_timeout=T(seconds=60),
        )
        if fast
        else {}
    )

    @inprocess.Wrapper(
        store_kwargs={"port": port + 2},
        rank_assignment=inprocess.Compose(
            MaxActiveWorldSize(active), ActivateAllRanks(), ShiftRanks()
        ),
        **intervals,
    )
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> None:
        assert call_wrapper is not None
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        rp.emit(ev="enter", it=call_wrapper.iteration, rank=rank, world=world, t=time.time())
        if held["store"] is None:  # the parent hosts this store
            held["store"] = TCPStore("127.0.0.1", port + 1, is_master=False)
        store = PrefixStore(f"it{call_wrapper.iteration}", held["store"])
        torch.distributed.init_process_group(
            "gloo", store=store, rank=rank, world_size=world, timeout=T(seconds=10)
        )
        have = [None] * world
        torch.distributed.all_gather_object(have, held["step"])
        src = max(range(world), key=lambda r: (have[r], -r))
        if min(have) < have[src]:
            box = [pack() if rank == src else None]
            torch.distributed.broadcast_object_list(box, src=src)
            if rank != src:
                sd = torch.load(io.BytesIO(box[0]), weights_only=True)
                m.load_state_dict(sd["m"])
                opt.load_state_dict(sd["o"])
                held["step"] = sd["s"]
        while held["step"] < steps:
            s = held["step"]
            x, y = rp.batch(s, rank)
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            # One flat SUM allreduce, then / world: torch DDP re-wrapped after a restart
            # starts again from its first-iteration buckets, which sums in another order.
            grads = [p.grad for p in m.parameters()]
            flat = torch.cat([g.flatten() for g in grads])
            torch.distributed.all_reduce(flat)
            flat /= world
            for g, f in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(f.view_as(g))
            opt.step()
            held["step"] = s + 1
            rp.emit(ev="step", s=s, ok=True, t=time.time(), rank=rank, it=call_wrapper.iteration)
        torch.distributed.destroy_process_group()

    train()
    rp.emit(ev="done", sha=rp.sha(m), step=held["step"])


def run(n: int, active: int, steps: int, kill: tuple[int, int] | None, tuned: bool) -> dict:
    from torch.distributed import TCPStore

    port = rp.free_port()
    while port + 2 > 65535:
        port = rp.free_port()
    store = TCPStore("127.0.0.1", port + 1, is_master=True, wait_for_workers=False)
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n),
        "STEPS": str(steps),
        "ACTIVE": str(active),
        "TUNED": "1" if tuned else "0",
    }
    here = os.path.abspath(__file__)
    ws = [
        rp.Worker([here, "--worker"], {**env, "RANK": str(r), "LOCAL_RANK": str(r)}, f"nvrx{r}")
        for r in range(n)
    ]
    killed_at, deadline = None, time.time() + 300
    if kill:
        victim, at = kill
        killed_at = rp.kill_mid_step(ws[victim], at, deadline)
    for w in ws:
        try:
            w.proc.wait(timeout=max(1, deadline - time.time()))
        except Exception:
            w.proc.kill()
            w.proc.wait()
        w.thread.join()
    del store
    out: dict = {"workers": {}}
    for r, w in enumerate(ws):
        done = [ev for ev in w.events if ev["ev"] == "done"]
        stepped = any(e["ev"] == "step" for e in w.events)
        info = {"rc": w.proc.returncode, "sha": done[0]["sha"] if done and stepped else None}
        info["enters"] = [(e["it"], e["rank"], e["world"]) for e in w.events if e["ev"] == "enter"]
        if killed_at is not None and r != kill[0]:
            st = [e for e in w.events if e["ev"] == "step"]
            # The victim's last iteration; steps after the kill in it were in flight.
            it = max(e["it"] for e in ws[kill[0]].events if e["ev"] == "step")
            before = max((e["s"] for e in st if e["it"] <= it), default=-1)
            after = [e for e in st if e["it"] > it]
            info["in_flight_steps_finished"] = sum(
                1 for e in st if e["it"] <= it and e["t"] > killed_at
            )
            if after:
                info["kill_to_next_step_s"] = after[0]["t"] - killed_at
                # Steps this rank completes again, or (a spare) that it repeats after the kill.
                info["steps_trained_again"] = sum(1 for e in after if e["s"] <= before)
                info["first_steps_after_kill"] = [e["s"] for e in after[:3]]
        out["workers"][r] = info
    if killed_at is None:
        out["steps_per_s"] = rp.steps_per_s(ws[:1], 10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill-at", type=int, default=30)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--defaults", action="store_true", help="nvrx's default intervals")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-recovery", action="store_true")
    a = ap.parse_args()
    result: dict = vars(a).copy()
    tuned = not a.defaults
    if not a.skip_recovery:
        ref = run(5, 4, a.steps, None, tuned)
        rec = run(5, 4, a.steps, (1, a.kill_at), tuned)
        print(json.dumps({"ref": ref, "rec": rec}, indent=1), file=sys.stderr)
        ref_sha = {w["sha"] for w in ref["workers"].values() if w["sha"]}
        rec_sha = {w["sha"] for r, w in rec["workers"].items() if r != 1}
        result.update(recovery=rec, uninterrupted_sha=sorted(map(str, ref_sha)))
        result["bit_exact"] = len(ref_sha) == 1 and rec_sha == ref_sha
    if not a.skip_overhead:
        plain, nv = [], []
        for _ in range(a.reps):  # alternate the sides: A B A B
            plain.append(rp.steps_per_s(rp.run_plain(4, a.steps * 2), 10))
            nv.append(run(4, 4, a.steps * 2, None, tuned)["steps_per_s"])
        result.update(plain_steps_per_s=plain, nvrx_steps_per_s=nv)
        result["ratio_median"] = sorted(f / p for f, p in zip(nv, plain, strict=True))[len(nv) // 2]
    print(json.dumps(result))


if __name__ == "__main__":
    worker() if sys.argv[1:] == ["--worker"] else main()
