"""Straggler detection: the rule naming a straggler, and whole log windows of simulated ranks."""

from __future__ import annotations

import json
import random
import statistics

import pynvml
import pytest

from trainbox.health.logpoint import LogPointShare
from trainbox.health.step_clock import StepTimeTotals
from trainbox.health.stragglers import (
    COMPUTE,
    DATA,
    Rule,
    Stragglers,
    Suspect,
    cause_text,
    name_straggler,
    over,
    streak,
    throttled,
)

import fakenvml

RULE = Rule(factor=1.5, floor_s=0.001, windows=2)


@pytest.mark.parametrize(
    ("rank_s", "median_s", "slow"),
    [
        (0.0151, 0.010, True),  # over the factor and the floor
        (0.0149, 0.010, False),  # under the factor
        (0.000030, 0.000010, False),  # 3x, but microseconds: under the floor
        (0.0025, 0.0010, True),  # 2.5x and 1.5 ms over
        (0.0019, 0.0001, True),  # a median of almost nothing: the floor decides
        (0.0009, 0.0, False),
    ],
)
def test_over(rank_s: float, median_s: float, slow: bool) -> None:
    assert over(rank_s, median_s, RULE) is slow


@pytest.mark.parametrize(
    ("before", "rank_s", "after"),
    [(0, 0.020, 1), (1, 0.020, 2), (5, 0.020, 6), (3, 0.010, 0)],
)
def test_streak_counts_slow_windows_in_a_row(before: int, rank_s: float, after: int) -> None:
    assert streak(before, rank_s, 0.010, RULE) == after


def suspect(rank: int, rank_s: float, median_s: float = 0.010) -> Suspect:
    return Suspect(rank=rank, rank_s=rank_s, median_s=median_s)


# (suspects per cause, the last window's straggler as (rank, cause), expected (rank, cause, new))
JUDGED = [
    pytest.param({COMPUTE: None, DATA: None}, None, None, id="nobody-suspected"),
    pytest.param({COMPUTE: suspect(2, 0.012), DATA: None}, None, None, id="suspect-not-slow-now"),
    pytest.param(
        {COMPUTE: suspect(2, 0.030), DATA: None}, None, (2, COMPUTE, True), id="episode-starts"
    ),
    pytest.param(
        {COMPUTE: suspect(2, 0.030), DATA: None},
        (2, COMPUTE),
        (2, COMPUTE, False),
        id="episode-goes-on-unreported",
    ),
    pytest.param({COMPUTE: None, DATA: None}, (2, COMPUTE), None, id="episode-ends"),
    pytest.param(
        {COMPUTE: suspect(3, 0.030), DATA: None},
        (2, COMPUTE),
        (3, COMPUTE, True),
        id="another-rank-is-a-new-episode",
    ),
    pytest.param(
        {COMPUTE: None, DATA: suspect(1, 0.008, 0.0001)}, None, (1, DATA, True), id="data-wait"
    ),
    pytest.param(
        {COMPUTE: suspect(0, 0.020), DATA: suspect(1, 0.008, 0.001)},
        None,
        (1, DATA, True),
        id="the-larger-ratio-names-the-cause",
    ),
    pytest.param(
        {COMPUTE: suspect(0, 0.040), DATA: suspect(1, 0.003, 0.001)},
        None,
        (0, COMPUTE, True),
        id="compute-over-data",
    ),
    pytest.param(
        {COMPUTE: None, DATA: suspect(1, 0.0009, 0.0)}, None, None, id="data-under-the-floor"
    ),
]


@pytest.mark.parametrize(("suspects", "previous", "expected"), JUDGED)
def test_name_straggler(
    suspects: dict[str, Suspect | None],
    previous: tuple[int, str] | None,
    expected: tuple[int, str, bool] | None,
) -> None:
    last = None
    if previous is not None:
        last = name_straggler(
            {previous[1]: suspect(previous[0], 1.0)}, previous=None, rule=RULE
        ).straggler
    verdict = name_straggler(suspects, previous=last, rule=RULE)
    if expected is None:
        assert verdict.straggler is None
        assert not verdict.new
    else:
        assert verdict.straggler is not None
        got = (verdict.straggler.rank, verdict.straggler.cause, verdict.new)
        assert got == expected


@pytest.mark.parametrize(
    ("cause", "throttled", "text"),
    [
        (COMPUTE, "", "compute"),
        (COMPUTE, "HW thermal", "gpu throttle: HW thermal"),
        (DATA, "HW thermal", "data wait"),
    ],
)
def test_cause_text(cause: str, throttled: str, text: str) -> None:
    assert cause_text(cause, throttled) == text


class FakeClock:
    """One rank's window: `steps` steps of the given times per step."""

    def __init__(self) -> None:
        self.compute, self.data, self.wait = 0.004, 0.0001, 0.002
        # Steps since the last take: what a log window of `train.log_every` steps adds.
        self.steps = 0

    def take(self) -> StepTimeTotals:
        steps, self.steps = self.steps, 0
        per_step = self.compute + self.data + self.wait
        return StepTimeTotals(steps=steps, step_s=steps * per_step,
                              data_s=steps * self.data, wait_s=steps * self.wait)  # fmt: skip


class Job:
    """`world` simulated ranks, each with its own detector; log points summed and maxed here."""

    def __init__(self, world: int, rule: Rule = RULE, log_every: int = 50) -> None:
        self.clocks = [FakeClock() for _ in range(world)]
        self.log_every = log_every
        self.told: list[tuple[int, str]] = []
        self.parts = [
            Stragglers(
                clock,  # type: ignore[arg-type]
                rank=rank,
                rule=rule,
                exchange=self.exchange,
                describe=lambda _cause, rank=rank: {"host": f"n{rank // 4}", "cpus": f"{rank}"},
            )
            for rank, clock in enumerate(self.clocks)
        ]
        self.step = 0

    def exchange(self, payload: bytes, src: int) -> bytes:
        if payload:
            self.told.append((src, json.loads(payload)["host"]))
        return json.dumps({"host": f"n{src // 4}", "cpus": f"{src}"}).encode()

    def log_point(self) -> list[list[dict[str, object]]]:
        self.step += self.log_every
        for clock in self.clocks:
            clock.steps += self.log_every
        shares = [part.share() for part in self.parts]
        whole = LogPointShare(
            sums=tuple(map(sum, zip(*(s.sums for s in shares), strict=True))),
            maxes=tuple(map(max, zip(*(s.maxes for s in shares), strict=True))),
        )
        return [part.records(whole, step=self.step) for part in self.parts]


def stragglers_in(records: list[list[dict[str, object]]]) -> list[dict[str, object]]:
    """Rank 0's straggler records of one log point."""
    return [r for r in records[0] if r["kind"] == "straggler"]


def test_a_slowed_rank_is_named_once_per_episode_within_the_streak() -> None:
    job = Job(16)
    for _ in range(3):
        assert stragglers_in(job.log_point()) == []
    job.clocks[9].compute = 0.012
    assert stragglers_in(job.log_point()) == []  # one slow window is not yet a streak
    (named,) = stragglers_in(job.log_point())
    assert (named["rank"], named["host"], named["cause"], named["cpus"]) == (9, "n2", COMPUTE, "9")
    assert named["ratio"] == pytest.approx(3.0, rel=0.1)
    assert job.told == [(9, "n2")], "the named rank describes itself, once"
    for _ in range(3):
        assert stragglers_in(job.log_point()) == []  # the same episode is not reported again
    job.clocks[9].compute = 0.004
    job.log_point()
    job.clocks[9].compute = 0.012
    job.log_point()
    assert [r["rank"] for r in stragglers_in(job.log_point())] == [9], "a new episode"


def test_the_train_line_gets_the_spread_and_the_slowest_rank() -> None:
    job = Job(8)
    for rank, clock in enumerate(job.clocks):
        clock.compute = 0.001 * (rank + 1)
    train = job.log_point()[0][0]
    assert train["kind"] == "train"
    assert train["compute_s_min"] == pytest.approx(0.001)
    assert train["compute_s_max"] == pytest.approx(0.008)
    assert train["slowest_rank"] == 7
    median = statistics.median_low([0.001 * (rank + 1) for rank in range(8)])
    assert train["compute_s_p50"] == pytest.approx(median, rel=0.05)
    assert train["allreduce_wait_s_mean"] == pytest.approx(0.002)


def test_slow_data_is_named_as_data_wait() -> None:
    job = Job(4)
    job.log_point()
    job.clocks[3].data = 0.010
    job.log_point()
    (named,) = stragglers_in(job.log_point())
    assert (named["rank"], named["cause"]) == (3, DATA)


def test_ranks_slow_in_turn_are_never_a_streak() -> None:
    job = Job(8)
    for window in range(12):
        for rank, clock in enumerate(job.clocks):
            clock.compute = 0.012 if rank == window % 8 else 0.004
        assert stragglers_in(job.log_point()) == []


def test_microsecond_noise_never_names_a_rank() -> None:
    job = Job(8, Rule(factor=1.5, floor_s=0.001, windows=1))
    draw = random.Random(0)
    for _ in range(20):
        for clock in job.clocks:
            clock.compute = 0.0001 * draw.uniform(0.2, 5.0)
            clock.data = 0.00001 * draw.uniform(0.2, 5.0)
        assert stragglers_in(job.log_point()) == []


@pytest.mark.parametrize("windows", [1, 2, 3])
def test_a_straggler_is_named_after_exactly_its_windows(windows: int) -> None:
    job = Job(4, Rule(factor=1.5, floor_s=0.001, windows=windows))
    job.log_point()
    job.clocks[1].compute = 0.020
    named_at = next(n for n in range(1, 6) if stragglers_in(job.log_point()))
    assert named_at == windows


def test_the_median_stays_within_the_exact_extremes() -> None:
    # Every rank in one bin: the bin's middle would lie past them; the exact value is known.
    job = Job(4)
    train = job.log_point()[0][0]
    assert train["compute_s_min"] == train["compute_s_p50"] == train["compute_s_max"]


# (the GPU's clock event reasons, what a compute straggler's cause says of them)
THROTTLES = [
    pytest.param(pynvml.nvmlClocksEventReasonGpuIdle, "", id="idle-is-no-throttle"),
    pytest.param(pynvml.nvmlClocksEventReasonHwThermalSlowdown, "HW thermal", id="hw-thermal"),
    pytest.param(
        pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown,
        "HW slowdown, SW thermal",
        id="two-reasons",
    ),
]


@pytest.mark.parametrize(("reasons", "text"), THROTTLES)
def test_a_gpu_straggler_reads_its_clock_reasons_through_nvml(
    monkeypatch: pytest.MonkeyPatch, reasons: int, text: str
) -> None:
    node = fakenvml.change_gpu(fakenvml.healthy_node(), 1, clock_event_reasons=reasons)
    fakenvml.install(monkeypatch, node)
    assert throttled({"CUDA_VISIBLE_DEVICES": "1"}, 0) == text


def test_a_gpu_that_cannot_say_is_no_throttle(monkeypatch: pytest.MonkeyPatch) -> None:
    node = fakenvml.with_errors(
        fakenvml.healthy_node(),
        0,
        {"nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_NOT_SUPPORTED,
         "nvmlDeviceGetCurrentClocksThrottleReasons": pynvml.NVML_ERROR_NOT_SUPPORTED},
    )  # fmt: skip
    fakenvml.install(monkeypatch, node)
    assert throttled({}, 0) == ""


def test_short_log_windows_add_up_before_they_are_judged() -> None:
    # train.log_every=5: four log points make one judged window of 20 steps.
    job = Job(4, log_every=5)
    job.clocks[1].compute = 0.020
    points = {}
    for _ in range(16):
        records = job.log_point()[0]
        points[job.step] = records
    assert [step for step, records in points.items() if records] == [20, 40, 60, 80]
    named = {step for step, records in points.items() if stragglers_in([records])}
    assert named == {40}, "two judged windows of 20 steps, not two log windows of 5"
