"""Object-store run_dir on CPU: the training stall of a background upload, and upload MB/s.

    .venv/bin/python benchmarks/object_store_upload.py            # 76 MB, 256 MiB, 5 reps
    .venv/bin/python benchmarks/object_store_upload.py --quick    # 19 MB, 32 MiB, 1 rep (CI)
    .venv/bin/python benchmarks/object_store_upload.py --upload-only --reps 9   # MB/s only

One moto server process (tests/s3server.py) on loopback is the store, `run_dir=s3://bench/run`
the run. It is Python, on the same CPUs as the benchmark, and most likely the bottleneck of
every upload here: both sides of each comparison send to the same server, so the ratios mean
something; the absolute MB/s are this set-up's, not S3's.

**Stall.** One process trains checkpoint_cost.py's MLP (6 square layers, width 1024: 6.3M
parameters, a 76 MB payload of model and AdamW state; one intra-op thread, batch 8) and
checkpoints it to the run's working copy. The upload goes through trainbox's own objects, made
as `trainbox run` makes them: the config from `trainbox.api.load_config` (`run_dir=s3://...`,
`train.keep_last=1`), `RunStore.for_run`, whose `checkpoint_written` uploads the file, then
its `.sha256` marker, then the run's files, then prunes the store. Side by side, alternating:

* sync: `checkpoint.save`, then the RunStore's upload of it, waited for, in the training
  thread: how long training would stop if the save and the upload ran inline.
* async: what the trainer does with `run_dir=s3://` and `train.async_save=true`: a
  `saver.BackgroundSaver` for the whole run whose writer thread, once the file is written,
  waits for the previous upload, prunes locally and hands the file to
  `RunStore.checkpoint_written` (the `Uploads` thread). The training thread calls `settle()`
  right before the next `optimizer.step()`. Training keeps stepping until the write and the
  upload are both done. The stall is `submit` plus the wait in `settle()`; steps slower than
  the baseline (the median of 5 steps just before the save, after 5 untimed ones) while the
  writer and the upload run are counted apart: "+ slower steps" as checkpoint_cost.py
  counts them (each step's excess over the baseline, none below it), and "net slower",
  signed (the steps' sum less as many baselines), so that step-to-step noise cancels out.
* async-local: the same background save with no upload (a file-system run_dir): what local
  background saves cost, for comparison.
* no save: the control, as many steps as the last async save overlapped, after a baseline
  taken the same way. Its net per step is drift (steps after the baseline run a little
  faster or slower with no save at all); the "net" ratio below takes it off the others'.

Also reported, per save: how long the training thread waited, runnable, for a CPU (the
kernel's schedstat run delay; a wait for the GIL is a sleep and is not in it), and the CPU
seconds of this process's threads other than the training thread (saver, upload and
s3transfer threads) and of the server process.

**MB/s.** The same file of random bytes, alternating: trainbox's `Store.upload` (boto3's
`upload_file` with trainbox's TransferConfig: one request below 64 MiB, else 8 MiB parts) against
boto3's own `client.upload_file` with its defaults (8 MiB threshold and parts, 10 threads),
each on its own client, each object deleted (untimed) after its upload.

"others used N CPUs" in the progress lines, and `background_cpus`, count the moto server too:
it is not this process's child until it exits.

Targets (the object-store issue, item 4), judged in full runs only: a background upload's
training stall <= 0.10 of a synchronous save-and-upload's, and `Store.upload` at >= 0.9x the
MB/s of boto3's own `upload_file`. The stall is judged as checkpoint_cost.py judges a local
background save (submit + settle), and, the stricter reading, with the time the slower steps
lost too, by the training thread's own clocks: its waits for a CPU (schedstat), its sleeps
outside settle() (the GIL), and its CPU per step above the no-save control's (of the same
repetition), times the steps.
Wall-clock "net" figures are printed too; step times on a VM drift between repetitions by
more than an upload costs, so they are not judged.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness
from checkpoint_cost import Training, tensor_bytes

import trainbox.api as trainbox
from trainbox.checkpoint import files as checkpoint
from trainbox.checkpoint.saver import BackgroundSaver
from trainbox.storage.location import parse
from trainbox.storage.store import Store
from trainbox.train.resume.run_store import RunStore

# A background upload's training stall over a synchronous save-and-upload's, at most.
TARGET_STALL_RATIO = 0.10
# Store.upload's MB/s over boto3's own upload_file's, at least.
TARGET_MBPS_RATIO = 0.9
BUCKET = "bench"
# Steps whose median is the baseline a slower step is slower than, and untimed steps before
# them: the first steps after a pause (the quiet wait sleeps) or a save run slower.
BASELINE_STEPS = 5
WARM_STEPS = 5
MIB = 1 << 20


def main() -> int:
    parse_args = harness.parser(__doc__)
    parse_args.add_argument("--width", type=int, default=0, help="layer width (0: 1024, quick 512)")
    parse_args.add_argument("--layers", type=int, default=6)
    parse_args.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1))
    parse_args.add_argument("--size-mib", type=int, default=0, help="MB/s file (0: 256, quick 32)")
    only = parse_args.add_mutually_exclusive_group()
    only.add_argument("--stall-only", action="store_true", help="no MB/s comparison")
    only.add_argument("--upload-only", action="store_true", help="no training stall")
    args = parse_args.parse_args()
    bench = harness.start("object_store_upload", args, reps=5)
    width = args.width or (512 if args.quick else 1024)
    size = (args.size_mib or (32 if args.quick else 256)) * MIB
    harness.torch_setup(args.threads)
    stall_report: dict[str, Any] = {}
    speed_report: dict[str, Any] = {}
    with harness.workdir("object-store") as work, s3_server(work) as server:
        if not args.upload_only:
            stall_report = _stall_part(server, work, width, args.layers, bench)
        if not args.stall_only:
            speed_report = _speed_part(server, work, size, bench)
    settings = {"reps": bench.reps, "threads": args.threads, "width": width, "layers": args.layers,
                "batch": 8, "upload_bytes": size, "stall_only": args.stall_only,
                "upload_only": args.upload_only}  # fmt: skip
    positive = [
        *(stall_report[k] for k in ("sync_stall_s", "async_stall_s", "baseline_step_s")
          if stall_report),
        *(v for runs in speed_report.get("upload_mb_per_s", {}).values() for v in runs),
    ]  # fmt: skip
    return bench.finish({"settings": settings, **stall_report, **speed_report}, positive=positive)


class Server:
    """The moto server: its endpoint, and its process's CPU seconds so far."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.pid = handle.process.pid

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process (all its threads)."""
        return harness.cpu_seconds(self.pid)


@contextlib.contextmanager
def s3_server(work: Path) -> Iterator[Server]:
    """tests/s3server.py's moto server with BUCKET made; this process set to use it."""
    sys.path.insert(0, str(harness.ROOT / "tests"))
    from s3server import S3Server

    with S3Server.start() as handle:
        handle.make_bucket(BUCKET)
        saved = {key: os.environ.get(key) for key in (*handle.env, "TMPDIR")}
        # The run's working copy (location.working_copy) goes under TMPDIR: the scratch folder.
        os.environ.update(handle.env, TMPDIR=str(work))
        try:
            yield Server(handle)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


# -- the stall -------------------------------------------------------------------------------


class Saves:
    """The three ways to checkpoint and the control, sharing one trainer, saver and RunStore."""

    def __init__(self, trainer: Training, server: Server, work: Path) -> None:
        self.trainer, self.server = trainer, server
        config = trainbox.load_config(
            None, [f"run_dir=s3://{BUCKET}/run", "train.keep_last=1", "train.async_save=true"]
        )
        store = RunStore.for_run(config, trainbox.launch_context())
        assert store is not None, "run_dir=s3:// makes a RunStore"
        self.store = store
        self.keep_last = config.train.keep_last
        # Checkpoints go where the trainer writes them: the working copy's checkpoints/.
        self.directory = store.mirror.local("checkpoints")
        self.local = work / "local" / "checkpoints"
        for folder in (self.directory, self.local):
            folder.mkdir(parents=True, exist_ok=True)
        self.saver = BackgroundSaver()
        # Steps the last async save (with its upload) overlapped: the control runs as many.
        self.steps_with_upload = 1

    def written(self, path: Path) -> None:
        """What the trainer does once a checkpoint is written (Checkpointer._written's steps)."""
        self.store.before_local_prune()
        checkpoint.prune(path.parent, self.keep_last)
        self.store.checkpoint_written(path, hook=_no_hook)

    def warm_up(self) -> None:
        """One untimed background save and upload: the snapshot's memory, boto3's client."""
        self.saver.submit(self.directory, self.trainer.steps, self.trainer.payload(0),
                          then=self.written, stable=self.trainer.stable())  # fmt: skip
        self.saver.settle()
        self.saver.join()
        self.store.uploads.join()

    def sync(self) -> dict[str, float]:
        """checkpoint.save and the upload in the training thread: the stall is all of it."""
        trainer = self.trainer
        baseline = self._start(self.directory)
        clocks = _Clocks(self.server)
        started = time.perf_counter()
        path = checkpoint.save(self.directory, trainer.steps, trainer.payload(trainer.steps))
        write = time.perf_counter() - started
        self.written(path)
        self.store.uploads.join()
        stall = time.perf_counter() - started
        used = clocks.read()
        after = trainer.step() - baseline  # the step after, for symmetry with async
        slower = max(0.0, after)
        return {"stall_s": stall, "submit_s": stall, "settle_s": 0.0, "slower_s": slower,
                "total_s": stall + slower, "net_slower_s": after, "net_total_s": stall + after,
                "copy_s": 0.0, "write_s": write,
                "upload_s": stall - write,
                "steps_during": 0, "baseline_s": baseline, **used}  # fmt: skip

    def background(self, *, upload: bool) -> dict[str, float]:
        """BackgroundSaver as the trainer uses it, the upload (if any) on the RunStore's thread:
        the stall is submit plus the wait in settle(); steps overlapping the copy, the write
        and the upload count extra."""
        trainer, saver, uploads = self.trainer, self.saver, self.store.uploads
        directory = self.directory if upload else self.local
        then = self.written if upload else (lambda p: checkpoint.prune(p.parent, self.keep_last))
        baseline = self._start(directory)
        clocks = _Clocks(self.server)
        started = time.perf_counter()
        saver.submit(directory, trainer.steps, trainer.payload(trainer.steps), then=then,
                     stable=trainer.stable())  # fmt: skip
        submit = time.perf_counter() - started
        # At least one step: its optimizer step must wait for the copy, as the trainer's does.
        during = [trainer.step(before_update=saver.settle)]
        settle = saver.settle_s
        while saver.busy or uploads.busy:
            during.append(trainer.step(before_update=saver.settle))
        saver.join()
        uploads.join()
        used = clocks.read()
        stall = submit + settle
        # The first step's time includes the wait in settle, counted in the stall already.
        during[0] -= settle
        slower = sum(max(0.0, t - baseline) for t in during)
        # Signed: faster steps offset slower ones, so step-to-step noise cancels out.
        net = sum(during) - len(during) * baseline
        if upload:
            self.steps_with_upload = len(during)
        return {"stall_s": stall, "submit_s": submit, "settle_s": settle, "slower_s": slower,
                "total_s": stall + slower, "net_slower_s": net, "net_total_s": stall + net,
                "copy_s": saver.copy_s, "write_s": saver.write_s,
                "upload_s": uploads.last_s if upload else 0.0, "steps_during": len(during),
                "baseline_s": baseline, **used}  # fmt: skip

    def no_save(self) -> dict[str, float]:
        """The control: as many steps as the last async save overlapped, measured against a
        baseline taken the same way, with no save at all. Its "slower" steps are noise and
        drift, the floor under the others'."""
        baseline = self._start(self.local)
        clocks = _Clocks(self.server)
        during = [self.trainer.step() for _ in range(self.steps_with_upload)]
        slower = sum(max(0.0, t - baseline) for t in during)
        net = sum(during) - len(during) * baseline
        return {"stall_s": 0.0, "submit_s": 0.0, "settle_s": 0.0, "slower_s": slower,
                "total_s": slower, "net_slower_s": net, "net_total_s": net, "copy_s": 0.0,
                "write_s": 0.0, "upload_s": 0.0, "steps_during": len(during),
                "baseline_s": baseline, **clocks.read()}  # fmt: skip

    def _start(self, directory: Path) -> float:
        """Each save starts alike: no local files, dirty pages flushed, a few steps to warm up
        again after the quiet wait's sleep and the side before; the baseline step."""
        harness.clear(directory)
        for _ in range(WARM_STEPS):
            self.trainer.step()
        return harness.median(self.trainer.step() for _ in range(BASELINE_STEPS))


class _Clocks:
    """From here on, for the calling (training) thread: its CPU seconds, how long it waited,
    runnable, for a CPU, and how long it slept (the rest of the wall time: waits for the GIL,
    for settle(), for a join); the CPU seconds of this process's other threads and of the
    server."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.wall, self.process, self.thread, self.served, self.waited = (
            time.perf_counter(), time.process_time(), time.thread_time(), server.cpu_s(),
            _run_queue_s(),
        )  # fmt: skip

    def read(self) -> dict[str, float]:
        wall = time.perf_counter() - self.wall
        train = time.thread_time() - self.thread
        waited = _run_queue_s() - self.waited
        return {
            "train_cpu_s": train,
            "cpu_wait_s": waited,
            "slept_s": max(0.0, wall - train - waited),
            "helper_cpu_s": max(0.0, time.process_time() - self.process - train),
            "server_cpu_s": self.server.cpu_s() - self.served,
        }


def _run_queue_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (the kernel's schedstat).

    A wait for the GIL is a sleep, not counted here: step time lost beyond this wait is not
    CPU contention."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _stall_part(
    server: Server, work: Path, width: int, layers: int, bench: harness.Bench
) -> dict[str, Any]:
    trainer = Training(width=width, layers=layers, batch=8)
    for _ in range(2):  # AdamW allocates its state on the first step
        trainer.step()
    saves = Saves(trainer, server, work)
    payload_bytes = tensor_bytes(trainer.payload(0))
    saves.warm_up()
    baseline = harness.median(trainer.step() for _ in range(BASELINE_STEPS))
    print(
        f"model: {trainer.params / 1e6:.1f}M parameters, checkpoint payload"
        f" {payload_bytes / 1e6:.0f} MB; baseline step {baseline * 1000:.0f} ms",
        flush=True,
    )
    stalls = bench.rounds([("sync", saves.sync),
                           ("async", lambda: saves.background(upload=True)),
                           ("async-local", lambda: saves.background(upload=False)),
                           ("no save", saves.no_save)])  # fmt: skip
    requests = dict(saves.store.mirror.store.requests)
    report = _stall_report(stalls, bench)
    return {"params": trainer.params, "payload_bytes": payload_bytes, "baseline_step_s": baseline,
            "store_requests": requests, **report}  # fmt: skip


def _stall_report(
    stalls: dict[str, list[dict[str, float]]], bench: harness.Bench
) -> dict[str, Any]:
    """The stall tables and verdicts, printed; the figures for the JSON line."""
    for runs in stalls.values():
        for r in runs:
            # The training thread's CPU per step, and its sleeps other than in settle(): with
            # one intra-op thread a step never sleeps, so these are waits for the GIL (or a
            # join, for sync).
            r["train_cpu_per_step_s"] = (
                r["train_cpu_s"] / r["steps_during"] if r["steps_during"] else 0.0
            )
            r["slept_not_settle_s"] = max(0.0, r["slept_s"] - r["settle_s"])
    med = {name: {key: harness.median(r[key] for r in runs) for key in runs[0]}
           for name, runs in stalls.items()}  # fmt: skip
    columns = {
        "training stall (s)": "stall_s", "in submit (s)": "submit_s", "in settle (s)": "settle_s",
        "+ slower steps (s)": "slower_s", "total cost (s)": "total_s",
        "net slower (s)": "net_slower_s", "net total (s)": "net_total_s",
        "steps during": "steps_during",
    }  # fmt: skip
    where = {
        "copy (s)": "copy_s", "write (s)": "write_s", "upload (s)": "upload_s",
        "helper CPU (s)": "helper_cpu_s", "server CPU (s)": "server_cpu_s",
    }  # fmt: skip
    training = {
        "training thread: CPU (s)": "train_cpu_s", "CPU per step (s)": "train_cpu_per_step_s",
        "waited for a CPU (s)": "cpu_wait_s", "slept, not in settle (s)": "slept_not_settle_s",
    }  # fmt: skip
    for shown in (columns, where, training):
        print(harness.table([["save", *shown]] + [
            [name, *(figures[key] for key in shown.values())] for name, figures in med.items()
        ]))  # fmt: skip
    sync_stall = med["sync"]["stall_s"]
    stall_ratio = med["async"]["stall_s"] / sync_stall
    total_ratio = med["async"]["total_s"] / sync_stall
    # Less the control's drift per step over as many steps: what the save itself costs.
    drift = med["no save"]["net_slower_s"] / med["no save"]["steps_during"]
    net = {name: med[name]["net_total_s"] - drift * med[name]["steps_during"]
           for name in ("async", "async-local")}  # fmt: skip
    net_ratio = net["async"] / sync_stall
    local_net_ratio = net["async-local"] / sync_stall
    stall_ok = bench.verdict(stall_ratio <= TARGET_STALL_RATIO)
    print(
        f"training stall: async/sync {stall_ratio:.4f} (target <= {TARGET_STALL_RATIO}):"
        f" {stall_ok}; with the slower steps: async/sync {total_ratio:.3f}; net, less the"
        f" no-save control's drift ({drift * 1000:+.2f} ms a step): {net_ratio:.3f}"
        f" (async-local/sync {local_net_ratio:.3f})"
    )
    # The stricter reading: every second the upload costs the training thread. Wall-clock
    # step times drift between repetitions by more than the upload costs, so it is judged by
    # the training thread's own clocks: waits for a CPU, sleeps outside settle() (the GIL),
    # and CPU per step above the control's.
    # Each repetition's async save against the control that ran right after it.
    for saved, control in zip(stalls["async"], stalls["no save"], strict=True):
        saved["extra_cpu_s"] = saved["steps_during"] * (
            saved["train_cpu_per_step_s"] - control["train_cpu_per_step_s"]
        )
        saved["accounted_s"] = (saved["stall_s"] + saved["cpu_wait_s"]
                                + saved["slept_not_settle_s"] + saved["extra_cpu_s"])  # fmt: skip
    runs = stalls["async"]
    extra_cpu = harness.median(r["extra_cpu_s"] for r in runs)
    parts = {"cpu_wait_s": med["async"]["cpu_wait_s"],
             "gil_and_other_sleeps_s": med["async"]["slept_not_settle_s"],
             "extra_cpu_s": extra_cpu}  # fmt: skip
    accounted = harness.median(r["accounted_s"] for r in runs) / sync_stall
    accounted_ok = bench.verdict(accounted <= TARGET_STALL_RATIO)
    print(
        f"stall and slower steps, by the training thread's clocks: waited for a CPU"
        f" {parts['cpu_wait_s']:.3f} s, slept outside settle()"
        f" {parts['gil_and_other_sleeps_s']:.3f} s, CPU above the control's {extra_cpu:+.3f} s"
        f" (medians); with the stall {accounted:.3f} of sync (stricter reading, same target:"
        f" {accounted_ok})"
    )
    return {
        "stall": stalls,
        "async_slower_parts": parts,
        "accounted_ratio_async_to_sync": accounted,
        "sync_stall_s": sync_stall,
        "async_stall_s": med["async"]["stall_s"],
        "async_total_s": med["async"]["total_s"],
        "async_net_total_s": net["async"],
        "async_local_stall_s": med["async-local"]["stall_s"],
        "async_local_net_total_s": net["async-local"],
        "no_save_drift_per_step_s": drift,
        "stall_ratio_async_to_sync": stall_ratio,
        "total_ratio_async_to_sync": total_ratio,
        "net_total_ratio_async_to_sync": net_ratio,
        "net_total_ratio_async_local_to_sync": local_net_ratio,
        "verdict_stall": stall_ok,
        "verdict_accounted": accounted_ok,
    }


# -- MB/s ------------------------------------------------------------------------------------


def _speed_part(server: Server, work: Path, size: int, bench: harness.Bench) -> dict[str, Any]:
    source = work / "upload.bin"
    with source.open("wb") as handle:
        for _ in range(size // MIB):
            handle.write(os.urandom(MIB))
    location = parse(f"s3://{BUCKET}/speed")
    assert location is not None
    store = Store(location)
    # boto3 as a user writes it: a client from the environment (AWS_ENDPOINT_URL and keys).
    import boto3

    client = boto3.session.Session().client("s3")
    key = location.key("boto3.bin")
    uploaders: dict[str, Callable[[], None]] = {
        "Store.upload": lambda: store.upload(source, "store.bin"),
        "boto3 upload_file": lambda: client.upload_file(str(source), BUCKET, key),
    }
    removers = {
        "Store.upload": lambda: store.delete(["store.bin"]),
        "boto3 upload_file": lambda: client.delete_object(Bucket=BUCKET, Key=key),
    }
    for name, upload in uploaders.items():  # untimed: connections, imports, the page cache
        upload()
        removers[name]()
    print(f"upload: {size / MIB:.0f} MiB file, {bench.reps} repetitions a side", flush=True)
    runs = bench.rounds(
        [(name, _timed_upload(upload, removers[name], server))
         for name, upload in uploaders.items()]
    )  # fmt: skip
    return _speed_report(runs, size, bench)


def _timed_upload(
    upload: Callable[[], None], remove: Callable[[], None], server: Server
) -> Callable[[], dict[str, float]]:
    def timed() -> dict[str, float]:
        before = (time.process_time(), server.cpu_s())
        started = time.perf_counter()
        upload()
        seconds = time.perf_counter() - started
        used = {"seconds": seconds, "client_cpu_s": time.process_time() - before[0],
                "server_cpu_s": server.cpu_s() - before[1]}  # fmt: skip
        remove()
        return used

    return timed


def _speed_report(
    runs: dict[str, list[dict[str, float]]], size: int, bench: harness.Bench
) -> dict[str, Any]:
    """The MB/s table and verdict, printed; the figures for the JSON line."""
    mbps = {name: [size / 1e6 / r["seconds"] for r in rs] for name, rs in runs.items()}
    rows = [["uploader", "median MB/s", "runs (MB/s)", "client CPU (s)", "server CPU (s)"]]
    for name, values in mbps.items():
        rows.append([name, harness.median(values), harness.spread(values),
                     harness.median(r["client_cpu_s"] for r in runs[name]),
                     harness.median(r["server_cpu_s"] for r in runs[name])])  # fmt: skip
    print(harness.table(rows))
    ratio = harness.ratio(mbps["Store.upload"], mbps["boto3 upload_file"])
    low, high = harness.ratio_interval(mbps["Store.upload"], mbps["boto3 upload_file"])
    ok = bench.verdict(ratio >= TARGET_MBPS_RATIO)
    print(f"Store.upload MB/s ratio: {ratio:.3f} of boto3 upload_file (90 % interval"
          f" {low:.3f}-{high:.3f}; target >= {TARGET_MBPS_RATIO}): {ok}")  # fmt: skip
    return {
        "upload": runs,
        "upload_mb_per_s": mbps,
        "mbps_ratio_store_to_boto3": ratio,
        "mbps_ratio_interval": [low, high],
        "verdict_mbps": ok,
    }


def _no_hook(point: str) -> None:
    """The fault-point hook: nothing here (tests cut uploads short through it)."""


if __name__ == "__main__":
    raise SystemExit(main())
