"""What metrics sinks cost the training thread: MetricsFile.append with no sink, with sinks on
trainbox's background thread, and (for contrast) the same sinks called inline.

The sinks are TensorBoard's event writer and a stand-in for a remote tracker that takes
`--remote-ms` per record (a network round trip). Target: sinks on the thread add under 50 µs per
record to the caller (a log point comes every `train.log_every` steps of milliseconds each),
while inline they would add the round trip itself. The ratios are printed beside it.

    .venv/bin/python benchmarks/sink_cost.py [--quick] [--reps N] [--records N]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import harness

from trainbox.sinks import Sink
from trainbox.sinks.tensorboard import TensorBoardSink
from trainbox.train.watch.metrics import MetricsFile

# Most a record's sinks may add to the training thread, in µs.
TARGET_US = 50.0


class Remote:
    """Takes `seconds` per record, as a tracking server's round trip would."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def write(self, record: Mapping[str, Any]) -> None:
        del record  # only the time it takes matters here
        time.sleep(self.seconds)

    def close(self) -> None:
        pass


class Inline(MetricsFile):
    """MetricsFile calling its sinks on the caller's thread: what the background thread avoids."""

    def __init__(self, path: Path, sinks: list[Sink]) -> None:
        super().__init__(path, enabled=True)
        self.inline = sinks

    def append(self, record: dict[str, Any]) -> None:
        super().append(record)
        for sink in self.inline:
            sink.write(record)


def record(step: int) -> dict[str, Any]:
    return {"kind": "train", "step": step, "epoch": 0, "loss": 1.0 / step, "lr": 0.003,
            "samples_per_s": 31000.0, "step_time_s": 0.002, "data_wait_share": 0.19,
            "time": time.time()}  # fmt: skip


def appends(work: Path, side: str, *, records: int, remote_s: float) -> float:
    """Seconds per append on the caller's thread (the drain at close is not the step's cost)."""
    run = work / f"{side}-{time.monotonic_ns()}"
    run.mkdir()
    sinks: list[Sink] = [TensorBoardSink(run / "tensorboard"), Remote(remote_s)]
    metrics = {
        "no sink": lambda: MetricsFile(run / "metrics.jsonl", enabled=True),
        "sinks, background": lambda: MetricsFile(run / "metrics.jsonl", enabled=True, sinks=sinks),
        "sinks, inline": lambda: Inline(run / "metrics.jsonl", sinks),
    }[side]()
    started = time.perf_counter()
    for step in range(1, records + 1):
        metrics.append(record(step))
    spent = time.perf_counter() - started
    metrics.close()
    for sink in sinks:
        sink.close()
    return spent / records


def main() -> int:
    parse = harness.parser(__doc__)
    parse.add_argument("--records", type=int, default=0, help="appends per run (0: 200, quick 20)")
    parse.add_argument("--remote-ms", type=float, default=5.0, help="the stand-in's round trip")
    args = parse.parse_args()
    bench = harness.start("sink_cost", args, reps=5, quick_reps=2)
    records = args.records or (20 if args.quick else 200)
    remote_s = args.remote_ms / 1000
    with harness.workdir("sinks") as work:
        runs = bench.rounds(
            [(side, functools.partial(appends, work, side, records=records, remote_s=remote_s))
             for side in ("no sink", "sinks, background", "sinks, inline")],
            quiet=False,
        )  # fmt: skip
    micros = {side: [s * 1e6 for s in values] for side, values in runs.items()}
    print(harness.medians(["side", "median µs per append", "runs (µs)"], micros, ".0f"))
    background = harness.ratio(micros["sinks, background"], micros["no sink"])
    inline = harness.ratio(micros["sinks, inline"], micros["no sink"])
    added = harness.median(micros["sinks, background"]) - harness.median(micros["no sink"])
    print(f"append cost with sinks vs without: background {background:.2f}x, inline {inline:.1f}x;"
          f" added by background sinks {added:.1f} µs per record (target < {TARGET_US:.0f}:"
          f" {bench.verdict(added < TARGET_US)})")  # fmt: skip
    return bench.finish(
        {
            "settings": {"reps": bench.reps, "records": records, "remote_ms": args.remote_ms},
            "us_per_append": micros,
            "ratio_background": background,
            "ratio_inline": inline,
            "added_us_background": added,
        },
        positive=[v for values in micros.values() for v in values],
    )


if __name__ == "__main__":
    raise SystemExit(main())
