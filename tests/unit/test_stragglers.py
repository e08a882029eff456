"""Straggler detection: the rule naming a straggler, the cause it gives, and whole log windows of
simulated ranks (each rank's own detector, the log point's SUM and MAX done here)."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass, replace

import pynvml
import pytest

from trainbox.health.logpoint import LogPointShare
from trainbox.health.step_clock import WAIT, StepTimes, StepTimeTotals
from trainbox.health.stragglers import (
    COMPUTE,
    DATA,
    DESCRIPTION_BYTES,
    OUTSIDE,
    PAUSED,
    Rule,
    Stragglers,
    Suspect,
    cause_of,
    cause_text,
    description,
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


# (the window's suspect, the last window's straggler's rank, expected (rank, new) or None)
JUDGED = [
    pytest.param(None, None, None, id="nobody-suspected"),
    pytest.param(suspect(2, 0.012), None, None, id="suspect-not-slow-now"),
    pytest.param(suspect(2, 0.030), None, (2, True), id="episode-starts"),
    pytest.param(suspect(2, 0.030), 2, (2, False), id="episode-goes-on-unreported"),
    pytest.param(None, 2, None, id="episode-ends"),
    pytest.param(suspect(2, 0.012), 2, None, id="episode-ends-under-the-factor"),
    pytest.param(suspect(3, 0.030), 2, (3, True), id="another-rank-is-a-new-episode"),
    pytest.param(suspect(1, 0.008, 0.0001), None, (1, True), id="a-median-of-almost-nothing"),
    pytest.param(suspect(1, 0.0009, 0.0), None, None, id="under-the-floor"),
]


@pytest.mark.parametrize(("found", "previous", "expected"), JUDGED)
def test_name_straggler(
    found: Suspect | None, previous: int | None, expected: tuple[int, bool] | None
) -> None:
    last = None
    if previous is not None:
        last = name_straggler(suspect(previous, 1.0), previous=None, rule=RULE).straggler
    verdict = name_straggler(found, previous=last, rule=RULE)
    if expected is None:
        assert verdict.straggler is None
        assert not verdict.new
    else:
        assert verdict.straggler is not None
        assert (verdict.straggler.rank, verdict.new) == expected
        assert found is not None
        assert verdict.straggler.ratio == pytest.approx(found.rank_s / max(found.median_s, 1e-6))


def times(compute: float = 0.004, data: float = 0.0001, outside: float = 0.0002,
          paused: float = 0.0, wait: float = 0.002) -> StepTimes:  # fmt: skip
    return StepTimes(compute=compute, data=data, wait=wait, outside=outside, paused=paused)


# (the named rank's parts, the medians' parts, the cause it gives)
CAUSES = [
    pytest.param(times(compute=0.020), times(), COMPUTE, id="own-work"),
    pytest.param(times(data=0.010), times(), DATA, id="data-wait"),
    pytest.param(times(outside=0.012), times(), OUTSIDE, id="between-steps"),
    pytest.param(times(paused=0.009, wait=0.0), times(), PAUSED, id="paused-in-the-collective"),
    pytest.param(
        times(compute=0.012, data=0.006), times(), COMPUTE, id="a-mix-names-the-larger-part"
    ),
    pytest.param(
        times(compute=0.006, paused=0.008), times(), PAUSED, id="paused-over-a-little-compute"
    ),
    pytest.param(
        times(compute=0.010, data=0.010),
        times(compute=0.008, data=0.0001),
        DATA,
        id="against-each-parts-own-median",
    ),
    pytest.param(times(), times(), COMPUTE, id="a-tie-goes-to-compute"),
]


@pytest.mark.parametrize(("mine", "median", "cause"), CAUSES)
def test_cause_of(mine: StepTimes, median: StepTimes, cause: str) -> None:
    assert cause_of(mine, median) == cause


@pytest.mark.parametrize(
    ("cause", "throttled", "text"),
    [
        (COMPUTE, "", "compute"),
        (COMPUTE, "HW thermal", "gpu throttle: HW thermal"),
        (DATA, "HW thermal", "data wait"),
        (PAUSED, "HW thermal", "paused"),
    ],
)
def test_cause_text(cause: str, throttled: str, text: str) -> None:
    assert cause_text(cause, throttled) == text


def test_a_description_too_long_drops_its_least_needed_texts_and_still_parses() -> None:
    said = {"host": "h" * 100, "cpus": "0,2," * 50, "gpu": "g" * 100, "throttle": "t" * 100,
            "cause": PAUSED, "parts": [0.123456789] * 4}  # fmt: skip
    told = json.loads(description(said))
    assert len(description(said)) <= DESCRIPTION_BYTES
    assert (told["host"], told["cause"], told["cpus"]) == ("h" * 100, PAUSED, "")
    assert json.loads(description({"host": "n1", "cause": DATA})) == {"host": "n1", "cause": DATA}


class FakeClock:
    """One rank's window: `steps` steps of the given parts per step; its pauses fall while it
    is in the collective, where everyone else waits for it too."""

    def __init__(self) -> None:
        self.times = times()
        # Steps since the last take: what a log window of `train.log_every` steps adds.
        self.steps = 0

    def take(self) -> StepTimeTotals:
        steps, self.steps, t = self.steps, 0, self.times
        waits = t.wait + t.paused
        step = t.compute + t.data + waits
        return StepTimeTotals(steps=steps, step_s=steps * step, data_s=steps * t.data,
                              wait_s=steps * waits, wall_s=steps * (step + t.outside),
                              paused_s=(0.0, 0.0, 0.0, steps * t.paused))  # fmt: skip

    def window_starts(self) -> None:
        pass


assert WAIT == 3, "FakeClock charges its pauses to the collective's part"


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
        self.said = b""

    def exchange(self, payload: bytes, src: int) -> bytes:
        # The named rank's call comes with its payload; the others' get it.
        if payload:
            self.told.append((src, json.loads(payload)["host"]))
            self.said = payload
        return self.said

    def slow(self, rank: int, **parts: float) -> None:
        """`rank`'s parts from now on; a pause in the collective holds everyone there."""
        self.clocks[rank].times = replace(self.clocks[rank].times, **parts)
        held = max(clock.times.paused for clock in self.clocks)
        for clock in self.clocks:
            clock.times = replace(clock.times, wait=0.002 + held - clock.times.paused)

    def log_point(self) -> list[list[dict[str, object]]]:
        self.step += self.log_every
        for clock in self.clocks:
            clock.steps += self.log_every
        shares = [part.share() for part in self.parts]
        whole = LogPointShare(
            sums=tuple(map(sum, zip(*(s.sums for s in shares), strict=True))),
            maxes=tuple(map(max, zip(*(s.maxes for s in shares), strict=True))),
        )
        # The named rank's exchange comes first, as in a broadcast from it.
        order = sorted(range(len(self.parts)), key=lambda rank: rank != self._named(whole))
        out: dict[int, list[dict[str, object]]] = {}
        for rank in order:
            out[rank] = self.parts[rank].records(whole, step=self.step)
        return [out[rank] for rank in range(len(self.parts))]

    def _named(self, whole: LogPointShare) -> int:
        from trainbox.health import logpoint

        unpacked = logpoint.unpack(whole.maxes[-1])
        return -1 if unpacked is None else unpacked[1]


def stragglers_in(records: list[list[dict[str, object]]]) -> list[dict[str, object]]:
    """Rank 0's straggler records of one log point."""
    return [r for r in records[0] if r["kind"] == "straggler"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Scenario:
    """Simulated windows: what one rank does from the second window on, and the verdict."""

    # The rank that changes.
    rank: int
    # Its parts per step from the second window on (times()'s keywords).
    parts: dict[str, float]
    # (the cause named, the window it is named at), or None: nobody is named.
    named: tuple[str, int] | None


# What a rank does and whether, when and why it is named (16 ranks, 2 windows in a row).
SCENARIOS = [
    pytest.param(Scenario(rank=9, parts={"compute": 0.012}, named=(COMPUTE, 3)), id="compute"),
    pytest.param(Scenario(rank=3, parts={"data": 0.010}, named=(DATA, 3)), id="data-wait"),
    pytest.param(
        Scenario(rank=5, parts={"outside": 0.010}, named=(OUTSIDE, 3)), id="outside-the-step"
    ),
    pytest.param(
        Scenario(rank=2, parts={"paused": 0.009}, named=(PAUSED, 3)),
        id="paused-in-the-collective",
    ),
    pytest.param(
        # No part alone is over its median by the factor and the floor, yet the others wait
        # for it every step.
        Scenario(
            rank=7,
            parts={"compute": 0.0058, "data": 0.0009, "outside": 0.0009, "paused": 0.0008},
            named=(COMPUTE, 3),
        ),
        id="last-to-arrive-by-a-mix",
    ),
    pytest.param(Scenario(rank=4, parts={"compute": 0.0055}, named=None), id="under-the-factor"),
    pytest.param(
        Scenario(rank=4, parts={"paused": 0.0008, "wait": 0.0}, named=None),
        id="a-short-pause-under-the-floor",
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_rank_the_others_wait_for_is_named_with_its_cause(scenario: Scenario) -> None:
    job = Job(16)
    assert stragglers_in(job.log_point()) == []
    job.slow(scenario.rank, **scenario.parts)
    named = {}
    for window in range(2, 7):
        for record in stragglers_in(job.log_point()):
            named[window] = record
    if scenario.named is None:
        assert named == {}
        return
    cause, window = scenario.named
    assert list(named) == [window], "named once, when its streak is complete"
    record = named[window]
    assert (record["rank"], record["cause"], record["host"]) == (
        scenario.rank, cause, f"n{scenario.rank // 4}")  # fmt: skip
    assert job.told == [(scenario.rank, f"n{scenario.rank // 4}")], "it describes itself, once"


def test_a_slowed_rank_is_named_once_per_episode_within_the_streak() -> None:
    job = Job(16)
    for _ in range(3):
        assert stragglers_in(job.log_point()) == []
    job.slow(9, compute=0.012)
    assert stragglers_in(job.log_point()) == []  # one slow window is not yet a streak
    (named,) = stragglers_in(job.log_point())
    assert (named["rank"], named["host"], named["cause"], named["cpus"]) == (9, "n2", COMPUTE, "9")
    # Own time: 12.3 ms against the median's 4.3 ms.
    assert named["ratio"] == pytest.approx(0.0123 / 0.0043, rel=0.1)
    assert named["compute_s"] == pytest.approx(0.012)
    assert job.told == [(9, "n2")], "the named rank describes itself, once"
    for _ in range(3):
        assert stragglers_in(job.log_point()) == []  # the same episode is not reported again
    job.slow(9, compute=0.004)
    job.log_point()
    job.slow(9, compute=0.012)
    job.log_point()
    assert [r["rank"] for r in stragglers_in(job.log_point())] == [9], "a new episode"


def test_the_train_line_gets_the_spread_and_the_slowest_rank() -> None:
    job = Job(8)
    for rank in range(8):
        job.slow(rank, compute=0.001 * (rank + 1))
    job.slow(2, paused=0.010)
    train = job.log_point()[0][0]
    assert train["kind"] == "train"
    assert train["compute_s_min"] == pytest.approx(0.001)
    assert train["compute_s_max"] == pytest.approx(0.008)
    assert train["slowest_rank"] == 2, "the rank the others wait for, not the most compute"
    assert train["own_s_max"] == pytest.approx(0.003 + 0.0003 + 0.010)
    assert train["paused_s_max"] == pytest.approx(0.010)
    assert train["paused_s_p50"] == 0.0
    median = statistics.median_low([0.001 * (rank + 1) for rank in range(8)])
    assert train["compute_s_p50"] == pytest.approx(median, rel=0.05)
    assert train["outside_s_p50"] == pytest.approx(0.0002, rel=0.05)
    # Each rank waits for the pause but rank 2, which was paused.
    assert train["allreduce_wait_s_mean"] == pytest.approx(0.002 + 0.010 * 7 / 8)


def test_ranks_slow_in_turn_are_never_a_streak() -> None:
    job = Job(8)
    for window in range(12):
        for rank in range(8):
            job.slow(rank, compute=0.012 if rank == window % 8 else 0.004)
        assert stragglers_in(job.log_point()) == []


def test_microsecond_noise_never_names_a_rank() -> None:
    job = Job(8, Rule(factor=1.5, floor_s=0.001, windows=1))
    draw = random.Random(0)
    for _ in range(20):
        for rank in range(8):
            job.slow(rank, compute=0.0001 * draw.uniform(0.2, 5.0),
                     data=0.00001 * draw.uniform(0.2, 5.0),
                     outside=0.00001 * draw.uniform(0.2, 5.0),
                     paused=0.0001 * draw.uniform(0.0, 5.0))  # fmt: skip
        assert stragglers_in(job.log_point()) == []


@pytest.mark.parametrize("windows", [1, 2, 3])
def test_a_straggler_is_named_after_exactly_its_windows(windows: int) -> None:
    job = Job(4, Rule(factor=1.5, floor_s=0.001, windows=windows))
    job.log_point()
    job.slow(1, paused=0.020)
    named_at = next(n for n in range(1, 6) if stragglers_in(job.log_point()))
    assert named_at == windows


def test_the_median_stays_within_the_exact_extremes() -> None:
    # Every rank in one bin: the bin's middle would lie past them; the exact value is known.
    job = Job(4)
    train = job.log_point()[0][0]
    assert train["compute_s_min"] == train["compute_s_p50"] == train["compute_s_max"]
    assert train["own_s_p50"] == train["own_s_max"]


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
    job.slow(1, compute=0.020)
    points = {}
    for _ in range(16):
        records = job.log_point()[0]
        points[job.step] = records
    assert [step for step, records in points.items() if records] == [20, 40, 60, 80]
    named = {step for step, records in points.items() if stragglers_in([records])}
    assert named == {40}, "two judged windows of 20 steps, not two log windows of 5"
