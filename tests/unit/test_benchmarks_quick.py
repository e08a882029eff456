"""The benchmarks' own arithmetic: interleaving, steady state, sanity, import times, projection.

The benchmarks themselves run quick in tests/dist/test_benchmarks_run.py; these tests pin
down the pure parts that turn their measurements into the reported numbers.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import first_step
import goodput
import harness
import per_rank_costs
import pyprofile
import scaling


def test_interleave_alternates_the_sides() -> None:
    order: list[str] = []
    sides = [(name, lambda name=name: order.append(name) or len(order)) for name in "AB"]
    results = harness.interleave(3, sides)
    assert order == ["A", "B", "A", "B", "A", "B"]
    assert results == {"A": [1, 3, 5], "B": [2, 4, 6]}


def test_steady_state_skips_warmup_and_takes_the_median_window() -> None:
    # Windows of 10 steps: 1 s each, one disturbed window of 5 s, and a slow warm-up.
    marks = [(10, 100.0), (20, 101.0), (30, 102.0), (40, 107.0), (50, 108.0), (60, 109.0)]
    assert harness.steady_step_time([(0, 0.0), *marks], warmup=10) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="two marks"):
        harness.steady_step_time(marks, warmup=60)


def test_ratio_is_of_medians() -> None:
    assert harness.ratio([1.0, 2.0, 100.0], [1.0, 1.0, 1.0]) == 2.0


def test_the_ratio_interval_holds_the_ratio_and_is_the_same_every_time() -> None:
    off, on = [1.00, 1.02, 0.97, 1.05, 0.99, 1.01], [1.00, 1.03, 0.98, 1.00, 1.04, 0.96]
    low, high = harness.ratio_interval(off, on)
    assert low < harness.ratio(off, on) < high
    assert (low, high) == harness.ratio_interval(off, on)


def test_the_ratio_interval_of_runs_without_noise_is_a_point() -> None:
    assert harness.ratio_interval([2.0] * 5, [1.0] * 5) == (2.0, 2.0)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ({"a": [1.0, -2.0], "b": {"c": 3}}, True),
        ({"a": [1.0, math.nan]}, False),
        ({"a": {"b": math.inf}}, False),
        ({"text": "x", "flag": True, "none": None}, True),
    ],
)
def test_sane_means_finite(value: object, ok: bool) -> None:
    assert harness.sane(value) is ok


def test_finish_fails_on_a_non_positive_measurement(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.finish("x", {"a": 1.0}, positive=[1.0], quick=True, save=False) == 0
    assert harness.finish("x", {"a": 1.0}, positive=[0.0], quick=True, save=False) == 1
    assert '"sane":false' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("given", "quick", "reps"),
    [(0, False, 5), (0, True, 2), (7, False, 7), (7, True, 7)],
)
def test_a_run_takes_reps_given_else_its_modes_default(given: int, quick: bool, reps: int) -> None:
    args = argparse.Namespace(reps=given, quick=quick, save=False)
    assert harness.start("x", args, reps=5, quick_reps=2).reps == reps


@pytest.mark.parametrize(
    ("bound", "value", "line"),
    [
        ({"at_most": 0.25}, 0.1, "extra: +0.100 s (target <= 0.25 s): PASS"),
        ({"at_most": 0.25}, 0.3, "extra: +0.300 s (target <= 0.25 s): MISS"),
        ({"at_least": 0.98}, 0.99, "extra: +0.990 s (target >= 0.98 s): PASS"),
    ],
)
def test_judge_prints_the_value_against_its_target(
    bound: dict[str, float], value: float, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = harness.Bench(name="x", quick=False, save=False, reps=1)
    verdict = bench.judge("extra", value, shown="+.3f", unit=" s", **bound)
    assert capsys.readouterr().out.strip() == line
    assert verdict == line.rsplit(" ", 1)[1]


def test_a_column_takes_one_field_of_every_run_per_side() -> None:
    runs = {"a": [{"t": 1.0, "u": 0}, {"t": 2.0, "u": 0}], "b": [{"t": 3.0, "u": 0}]}
    assert harness.column(runs, "t") == {"a": [1.0, 2.0], "b": [3.0]}


def test_the_runs_cell_lists_every_run_in_order() -> None:
    assert harness.spread([3.14159, 2.0], ".2f") == "3.14 2.00"


def test_quick_runs_judge_no_target() -> None:
    assert harness.verdict(False, quick=True) == "n/a (quick)"
    assert harness.verdict(True, quick=False) == "PASS"
    assert harness.verdict(False, quick=False) == "MISS"


def test_clean_env_drops_launcher_and_thread_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    env = harness.clean_env(OMP_NUM_THREADS="1")
    assert "RANK" not in env
    assert "SLURM_JOB_ID" not in env
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(harness.HERE)


def test_table_aligns_columns() -> None:
    text = harness.table([["name", "value"], ["a", 1.23456], ["longer", 10]])
    assert text.splitlines() == ["name    value", "------  -----", "a       1.235", "longer  10"]


def test_goodput_kills_the_worker_under_restart_and_the_keepers_older_child_in_process() -> None:
    def proc(pid: int, started: int, **env: str) -> goodput.Process:
        return goodput.Process(pid=pid, started=started, env=env)

    # Rank 1 under restart: its torchrun worker; none while a restart has not started it yet.
    workers = [proc(10, 1, RANK="0"), proc(11, 1, RANK="1")]
    assert goodput._victim(workers, "restart", 1) == 11
    assert goodput._victim(workers[:1], "restart", 1) is None
    # Under in_process: never the keeper (no role) nor the waiting spare. After a recovery the
    # trainer is the spare that took over, which still shows the role it started with.
    first = [proc(20, 1, RANK="1"), proc(21, 2, RANK="1", TRAINBOX_ROLE="trainer"),
             proc(22, 3, RANK="1", TRAINBOX_ROLE="spare")]  # fmt: skip
    assert goodput._victim(first, "in_process", 1) == 21
    after = [first[0], first[2], proc(23, 9, RANK="1", TRAINBOX_ROLE="spare")]
    assert goodput._victim(after, "in_process", 1) == 22
    assert goodput._victim(first, "restart", 1) == 20


def test_goodput_keeps_the_newest_whole_checkpoint(tmp_path: Path) -> None:
    assert goodput._newest_checkpoint(tmp_path) == 0
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    for name in ("step-00000500.pt", "step-00000500.pt.sha256", "step-00001000.pt"):
        (checkpoints / name).touch()
    # Step 1000 has no .sha256 marker yet: it is still being written.
    assert goodput._newest_checkpoint(tmp_path) == 500


def test_importtime_lines_parse_with_their_nesting() -> None:
    text = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:       100 |        100 |   yaml.error",
        "import time:       200 |       1300 | yaml",
        "some other line",
    ])  # fmt: skip
    assert first_step.parse_importtime(text) == [("yaml.error", 100e-6, 1), ("yaml", 1300e-6, 0)]


def test_ring_allreduce_volume() -> None:
    assert scaling.allreduce_bytes(1e6, 2) == 4e6
    assert scaling.allreduce_bytes(1e6, 8) == 2 * 7 / 8 * 4e6


def test_projection_hides_communication_behind_the_backward_pass() -> None:
    fast = scaling.projected_efficiency(
        100e6, 8, busbw_gb_per_s=300, step_compute_s=0.1, hop_latency_s=0
    )
    slow = scaling.projected_efficiency(
        100e6, 8, busbw_gb_per_s=1, step_compute_s=0.1, hop_latency_s=0
    )
    # 700 MB at 300 GB/s is 2.3 ms, hidden but for the last of 16 buckets.
    assert fast == pytest.approx(0.1 / (0.1 + 0.7e9 / 300e9 / 16), rel=1e-3)
    # At 1 GB/s, 0.7 s of all-reduce less the 67 ms backward pass it overlaps.
    comm = 2 * 7 / 8 * 4 * 100e6 / 1e9
    assert slow == pytest.approx(0.1 / (0.1 + comm - 0.1 * 2 / 3 * 15 / 16), rel=1e-3)
    assert scaling.projected_efficiency(100e6, 1, busbw_gb_per_s=1, step_compute_s=0.1) == 1.0


def test_startup_lookups_count_each_call_once_and_its_failure_once() -> None:
    trace = [
        '7 openat(AT_FDCWD, "/a.so", O_RDONLY|O_CLOEXEC) = 3',
        '7 newfstatat(AT_FDCWD, "/b.py", 0x7ff, 0) = -1 ENOENT (No such file or directory)',
        '8 openat(AT_FDCWD, "/c", O_RDONLY <unfinished ...>',
        '7 read(3, "ENOENT", 6) = 6',
        "8 <... openat resumed>) = -1 ENOENT (No such file or directory)",
        "8 +++ exited with 0 +++",
    ]
    assert per_rank_costs.count_lookups(trace) == {"lookups": 3, "not_found": 2}


def _call(ident: int, parent: int | None, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": {"Python id": ident, "Python parent id": parent}}  # fmt: skip


def test_the_profile_books_self_time_by_function_and_builtins_to_their_caller() -> None:
    # Two recorded steps of 50 µs. The loop (open before the trace) calls backward, whose C
    # call runs a Python hook; the last optimizer step's annotation is still open at the end.
    steps = [{"ph": "X", "name": f"ProfilerStep#{i}", "ts": 100.0 + 50 * i, "dur": 50.0,
              "tid": 1} for i in range(2)]  # fmt: skip
    trace = {"traceEvents": [
        *steps,
        _call(1, None, "/x/src/trainbox/train/loop.py(10): fit", 0.0, 300.0),
        _call(2, 1, "torch/_tensor.py(600): backward", 110.0, 30.0),
        _call(3, 2, "<built-in method run_backward of object at 0x1>", 115.0, 20.0),
        _call(4, 3, "/x/src/trainbox/train/hooks.py(5): stamp", 120.0, 5.0),
        _call(5, None, "threading.py(300): wait", 0.0, 900.0, tid=2),
        _call(6, 5, "/x/src/trainbox/watchdog.py(9): beat", 130.0, 4.0, tid=2),
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 190.0,
         "dur": 5000.0, "tid": 1},
    ]}  # fmt: skip
    record = pyprofile.summarize(trace, main_tid=1)
    assert record["steps"] == 2
    assert record["step_ns"] == pytest.approx(50e3)
    per_step = {k: v / 1e3 for k, v in record["self_ns"].items()}
    # fit: its 100 µs inside the steps, less backward's 30; backward keeps its C call's own 15.
    assert per_step == pytest.approx({"trainbox/train/loop.py:fit": 35.0,
                                      "torch/_tensor.py:backward": 12.5,
                                      "trainbox/train/hooks.py:stamp": 2.5})  # fmt: skip
    inclusive = {k: v / 1e3 for k, v in record["inclusive_ns"].items()}
    assert inclusive == pytest.approx({"backward (with the gradient all-reduce's wait)": 15.0,
                                       "optimizer step": 5.0})  # fmt: skip
    assert record["owners_ns"]["trainbox"] / 1e3 == pytest.approx(37.5)
    # The other thread: its loop's wait does not count, its one whole Python call does.
    assert record["other_threads_ns"] / 1e3 == pytest.approx(2.0)
    assert (
        pyprofile.key("/w/.venv/lib/python3.11/site-packages/torch/nn/functional.py(3): relu")
        == "torch/nn/functional.py:relu"
    )


def test_the_functions_shown_are_ranked_by_their_median_not_one_run() -> None:
    # y took long in one run of three only (a log point, say): x and z are what a step does.
    runs = {"a": [{"x": 1.0, "y": 100.0}, {"x": 2.0}, {"x": 3.0}], "b": [{"z": 5.0}]}
    assert pyprofile.top(runs, rows=2) == ["z", "x"]
