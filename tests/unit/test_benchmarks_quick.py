"""The benchmarks' own arithmetic: interleaving, steady state, sanity, import times, projection,
and the bytes that leave a node under fsdp and hsdp.

The benchmarks themselves run quick in tests/dist/test_benchmarks_run.py; these tests pin
down the pure parts that turn their measurements into the reported numbers.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import benchtask
import first_step
import goodput
import harness
import node_traffic
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


def test_finish_is_not_sane_when_a_fact_does_not_hold(capsys: pytest.CaptureFixture[str]) -> None:
    holds = {"counted equals predicted": True, "hsdp sends less": False}
    assert harness.finish("x", {"a": 1.0}, positive=[1.0], quick=True, save=False) == 0
    assert harness.finish("x", {"a": 1.0}, positive=[1.0], holds=holds, quick=True,
                          save=False) == 1  # fmt: skip
    out, err = capsys.readouterr()
    assert '"holds":{"counted equals predicted":true,"hsdp sends less":false},"sane":false' in out
    assert "does not hold: hsdp sends less" in err


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


def _c(kind: str, ranks: tuple[int, ...], nbytes: int) -> node_traffic.Collective:
    return node_traffic.Collective(kind=kind, ranks=ranks, nbytes=nbytes)


# Linear(64, 10): a weight of 10 rows and a bias of 10, the rows padded to a multiple of the shard.
HEAD = node_traffic.Unit(shapes=((10, 64), (10,)))


@pytest.mark.parametrize(
    ("mesh", "units", "param_bytes", "step"),
    [
        # fsdp over 4: 10 rows pad to 12, 3 a rank: (3 * 64 + 3) * 4 ranks * 4 bytes = 3120.
        ((1, 4), [HEAD], 4, {_c("all_gather", (0, 1, 2, 3), 3120): 2,
                              _c("reduce_scatter", (0, 1, 2, 3), 3120): 1}),
        # hsdp (2, 2): gathers and reduce-scatters per node, then each shard's all-reduce.
        ((2, 2), [HEAD], 4, {_c("all_gather", (0, 1), 2600): 2, _c("all_gather", (2, 3), 2600): 2,
                              _c("reduce_scatter", (0, 1), 2600): 1,
                              _c("reduce_scatter", (2, 3), 2600): 1,
                              _c("all_reduce", (0, 2), 1300): 1,
                              _c("all_reduce", (1, 3), 1300): 1}),
        # bf16 gathers: half the all-gather's bytes; gradients are still reduced in fp32.
        ((1, 2), [HEAD], 2, {_c("all_gather", (0, 1), 1300): 2,
                              _c("reduce_scatter", (0, 1), 2600): 1}),
        # The root is gathered once (kept for backward); a root with no parameters makes nothing.
        ((1, 2), [node_traffic.Unit(shapes=((3, 2), ()), gathers=1),
                  node_traffic.Unit(shapes=(), gathers=1)], 4,
         {_c("all_gather", (0, 1), 2 * (2 * 2 + 1) * 4): 1,
          _c("reduce_scatter", (0, 1), 2 * (2 * 2 + 1) * 4): 1}),
        # Odd rows under hsdp: 5 pad to 6, 3 a rank, (3 * 4 + 3) * 4 bytes per shard.
        ((2, 2), [node_traffic.Unit(shapes=((5, 4), (5,)))], 4,
         {_c("all_gather", (0, 1), 120): 2, _c("all_gather", (2, 3), 120): 2,
          _c("reduce_scatter", (0, 1), 120): 1, _c("reduce_scatter", (2, 3), 120): 1,
          _c("all_reduce", (0, 2), 60): 1, _c("all_reduce", (1, 3), 60): 1}),
    ],
)  # fmt: skip
def test_the_predicted_step_is_fsdp2s_collectives_on_padded_shards(
    mesh: tuple[int, int],
    units: list[node_traffic.Unit],
    param_bytes: int,
    step: dict[node_traffic.Collective, int],
) -> None:
    assert node_traffic.predict_step(mesh, units, param_bytes=param_bytes) == Counter(step)


@pytest.mark.parametrize(
    ("collective", "ranks_per_node", "out"),
    [
        # A group over two nodes: each sends half an all-gather's output, a reduce-scatter's
        # input; an all-reduce is both, so the whole tensor.
        (_c("all_gather", (0, 1, 2, 3), 800), 2, {0: 400.0, 1: 400.0}),
        (_c("reduce_scatter", (0, 1, 2, 3), 800), 2, {0: 400.0, 1: 400.0}),
        (_c("all_reduce", (0, 2), 100), 2, {0: 100.0, 1: 100.0}),
        # Four nodes of one rank: (N - 1) / N of it, twice for an all-reduce.
        (_c("all_reduce", (0, 1, 2, 3), 100), 1, {n: 150.0 for n in range(4)}),
        (_c("broadcast", (0, 1, 2, 3), 100), 1, {n: 75.0 for n in range(4)}),
        # Inside one node nothing leaves it.
        (_c("all_gather", (2, 3), 800), 2, {1: 0.0}),
    ],
)
def test_bytes_leaving_a_node_follow_the_ring_between_nodes(
    collective: node_traffic.Collective, ranks_per_node: int, out: dict[int, float]
) -> None:
    assert node_traffic.leaving(collective, ranks_per_node) == out


def test_a_group_spread_unevenly_over_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="unevenly"):
        node_traffic.leaving(_c("all_reduce", (0, 1, 2), 8), 2)


@pytest.mark.parametrize(
    ("mesh", "bytes_per_node"),
    # What hsdp_traffic.py --quick counted in trainbox run (torch 2.13, gloo): fsdp pads the
    # head's 10 rows to 12 at 4 ranks, hsdp's 2 need none.
    [((1, 4), [42312.0, 42312.0]), ((2, 2), [27688.0, 27688.0])],
)
def test_the_quick_models_prediction_is_what_its_runs_counted(
    mesh: tuple[int, int], bytes_per_node: list[float]
) -> None:
    units = node_traffic.units_of(benchtask.model(in_features=32, classes=10, hidden=64, layers=2))
    assert [len(unit.shapes) for unit in units] == [2, 2, 2, 0]
    step = node_traffic.predict_step(mesh, units)
    assert node_traffic.bytes_leaving(step, 2, 2) == bytes_per_node


def _rank(rank: int, *calls: tuple[str, list[int], int, str, int]) -> dict[str, Any]:
    keys = ("kind", "ranks", "bytes", "source", "count")
    return {"rank": rank, "node": rank, "calls": [dict(zip(keys, c, strict=True)) for c in calls]}


def test_counted_collectives_are_fsdps_and_the_rest_each_counted_once() -> None:
    fsdp = "torch.distributed.fsdp._fully_shard._fsdp_collectives"
    files = [
        _rank(0, ("all_gather", [0, 1], 64, fsdp, 4), ("all_reduce", [0, 1], 8, "trainbox.x", 3)),
        _rank(1, ("all_gather", [0, 1], 64, fsdp, 4), ("all_reduce", [0, 1], 8, "trainbox.x", 3)),
    ]
    ours, others = node_traffic.counted(files)
    assert ours == Counter({_c("all_gather", (0, 1), 64): 4})
    assert others == Counter({_c("all_reduce", (0, 1), 8): 3})
    # A rank that counted a call fewer times: its file or the run is incomplete.
    files[1]["calls"][0]["count"] = 3
    with pytest.raises(ValueError, match="counted it differently"):
        node_traffic.counted(files)
