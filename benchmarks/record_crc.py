"""checkpoint/records.py's write (zip records without CRC32s) against torch.save, same sink.

    .venv/bin/python benchmarks/record_crc.py            # 403 MB and 12.6 MB payloads, 5 reps
    .venv/bin/python benchmarks/record_crc.py --quick    # 101 MB and 12.6 MB, 1 repetition (CI)

records.write reaches two private torch names (`torch._C.PyTorchFileWriter` made with its CRC32
flag off, and `torch.serialization._save`) to leave every zip record's CRC32 at 0; the project
keeps a private torch API only where a measured win pays for it. This measures the win.

Two payloads shaped as trainbox's checkpoint (`step`, the `model` state dict and AdamW's
`optimizer` state dict, float32): `large`, 8 square layers of width 2048 (33.6M parameters,
403 MB), and `small`, 4 layers of width 512 (1.05M parameters, 12.6 MB). For each payload,
two sinks:

* file: what checkpoint.save writes through: a new file, `Writeback` and `HashingWriter`
  (sha256 on its helper thread), then flush, fsync and the digest. The page cache is flushed
  (`sync`) before each write, untimed, so that no write pays for the one before.
* null: a writer that drops the bytes: the serialisation's own cost, nothing else.

Three writers, alternating in one run on the same payload and sink:

* records.write: what checkpoint.save calls.
* torch.save: the public call, CRC32s computed.
* torch.save crc32 off: `torch.serialization.set_crc32_options(False)` around torch.save, the
  public switch, which is process-wide (another thread's torch.save would lose its CRC32s too).

Each write's wall time and the process's CPU time (all its threads, sha256 helper included)
are recorded; the ratio printed is records.write's median time over torch.save's. Target (the
project's rule for a private API): records.write saves >= 10 % of torch.save's time, for the
large payload into the file sink, i.e. a ratio <= 0.90.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import torch
import torch.serialization

from trainbox.checkpoint import records
from trainbox.checkpoint.hashing import HashingWriter, WritableFile
from trainbox.checkpoint.writeback import Writeback

# records.write's time over torch.save's, at most, for the private path to pay for itself.
TARGET_RATIO = 0.90

Writer = Callable[[Any, WritableFile], None]


def payload(width: int, layers: int) -> dict[str, Any]:
    """What trainbox's checkpoint holds for an MLP of `layers` square layers with AdamW."""
    torch.manual_seed(0)
    model: dict[str, torch.Tensor] = {}
    for i in range(layers):
        model[f"{2 * i}.weight"] = torch.randn(width, width)
        model[f"{2 * i}.bias"] = torch.randn(width)
    state = {
        index: {"step": torch.tensor(10.0), "exp_avg": torch.randn_like(value),
                "exp_avg_sq": torch.rand_like(value)}
        for index, value in enumerate(model.values())
    }  # fmt: skip
    groups = [{"lr": 1e-4, "weight_decay": 0.01, "params": list(state)}]
    return {"step": 10, "model": model, "optimizer": {"state": state, "param_groups": groups}}


def crc32_off_save(obj: Any, sink: WritableFile) -> None:
    """torch.save with the public, process-wide switch off for the call."""
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(obj, sink)  # type: ignore[arg-type]
    finally:
        torch.serialization.set_crc32_options(True)


WRITERS: dict[str, Writer] = {
    "records.write": records.write,
    "torch.save": lambda obj, sink: torch.save(obj, sink),  # type: ignore[arg-type]
    "torch.save crc32 off": crc32_off_save,
}


class Null:
    """A sink that drops the bytes."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: Any, /) -> int:
        size = memoryview(data).nbytes
        self.written += size
        return size

    def flush(self) -> None:
        pass


def into_file(work: Path, obj: Any, write: Writer) -> tuple[float, float, int]:
    """One write as checkpoint.save makes it, from a clean page cache: (wall s, CPU s, bytes)."""
    harness.clear(work)
    path = work / "checkpoint.pt"
    wall, cpu = time.perf_counter(), time.process_time()
    with path.open("wb") as handle, HashingWriter(Writeback(handle), _ignore, payload=obj) as w:
        write(obj, w)
        handle.flush()
        os.fsync(handle.fileno())
        w.hexdigest()
    return time.perf_counter() - wall, time.process_time() - cpu, path.stat().st_size


def into_null(obj: Any, write: Writer) -> tuple[float, float, int]:
    """One write into a sink that drops the bytes: (wall s, CPU s, bytes)."""
    sink = Null()
    wall, cpu = time.perf_counter(), time.process_time()
    write(obj, sink)
    return time.perf_counter() - wall, time.process_time() - cpu, sink.written


def _ignore() -> None:
    pass


def check_loadable(work: Path, obj: Any) -> None:
    """What records.write wrote loads with plain torch.load(weights_only=True), equal."""
    path = work / "check.pt"
    with path.open("wb") as handle:
        records.write(obj, handle)
    loaded = torch.load(path, weights_only=True)
    path.unlink()
    assert loaded["step"] == obj["step"]
    for name, tensor in obj["model"].items():
        assert torch.equal(loaded["model"][name], tensor), name


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--dir", help="where to write (default: a temporary directory in /tmp)")
    args = parse.parse_args()
    bench = harness.start("record_crc", args, reps=5)
    cases = {"large": (1024 if args.quick else 2048, 8), "small": (512, 4)}
    work = Path(args.dir) if args.dir else harness.scratch("record-crc")
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    try:
        for case, (width, layers) in cases.items():
            obj = payload(width, layers)
            check_loadable(work, obj)
            for write in WRITERS.values():  # untimed: a process's first writes run slower
                into_file(work, obj, write)
            for sink in ("file", "null"):
                print(f"{case} payload ({width}x{width}, {layers} layers), {sink} sink", flush=True)
                runs = bench.rounds(
                    [(name, _side(work, obj, write, sink)) for name, write in WRITERS.items()]
                )
                judged = case == "large" and sink == "file"
                results[f"{case}/{sink}"] = _report(runs, bench, judged=judged)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    settings = {
        "reps": bench.reps,
        "cases": {k: {"width": w, "layers": n} for k, (w, n) in cases.items()},
    }
    positive = [t for r in results.values() for side in r["wall_s"].values() for t in side]
    return bench.finish({"settings": settings, "results": results}, positive=positive)


def _side(work: Path, obj: Any, write: Writer, sink: str) -> Callable[[], tuple[float, float, int]]:
    if sink == "file":
        return lambda: into_file(work, obj, write)
    return lambda: into_null(obj, write)


def _report(runs: dict[str, list[tuple[float, float, int]]], bench: harness.Bench, *,
            judged: bool) -> dict[str, Any]:  # fmt: skip
    """The table and ratios, printed; the figures for the JSON line."""
    size = next(iter(runs.values()))[0][2]
    wall, cpu = harness.column(runs, 0), harness.column(runs, 1)
    rows = [["writer", "median s", "runs (s)", "median CPU s", "MB/s"]]
    for name in runs:
        median = harness.median(wall[name])
        rows.append([name, median, harness.spread(wall[name], ".3f"),
                     harness.median(cpu[name]), size / 1e6 / median])  # fmt: skip
    print(f"{size / 1e6:.1f} MB per write")
    print(harness.table(rows))
    vs_save = harness.ratio(wall["records.write"], wall["torch.save"])
    vs_off = harness.ratio(wall["records.write"], wall["torch.save crc32 off"])
    cpu_vs_save = harness.ratio(cpu["records.write"], cpu["torch.save"])
    line = (f"records.write / torch.save: time {vs_save:.3f}, CPU {cpu_vs_save:.3f};"
            f" records.write / torch.save crc32 off: time {vs_off:.3f}")  # fmt: skip
    report: dict[str, Any] = {
        "bytes": size,
        "wall_s": wall,
        "cpu_s": cpu,
        "ratio_to_torch_save": vs_save,
        "cpu_ratio_to_torch_save": cpu_vs_save,
        "ratio_to_crc32_off": vs_off,
    }
    if judged:
        report["verdict"] = bench.verdict(vs_save <= TARGET_RATIO)
        line += f" (target <= {TARGET_RATIO}: {report['verdict']})"
    print(line, flush=True)
    return report


if __name__ == "__main__":
    raise SystemExit(main())
