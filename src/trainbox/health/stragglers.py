"""Straggler detection: a synchronous job runs at its slowest rank's speed; name that rank.

The rank the others wait for is the straggler, whatever it was doing: it comes last to the
step's collective, or holds everyone in it (a rank paused there). Each rank measures its own
time per step, all it did not spend waiting for others (health/step_clock.py): its compute, its
data wait, the time between its steps and the time it was paused. At each log point every rank
shares (a LogPointShare) histograms of those per step and, packed with its rank, its own time
where it has been slow for the windows before: one SUM and one MAX give every rank the same
medians and the same slowest suspect. `name_straggler` names a rank whose own time is over the
median's by `health.straggler_factor` for `health.straggler_windows` windows in a row, once per
episode. The named rank then says why (`cause_of`: the part of its time furthest over the
median's) and describes itself (host, CPUs, GPU and, on a GPU, NVML's clock event reasons) in
one broadcast, and logs the warning; rank 0 writes the record.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from trainbox.affinity.facts import format_cpulist
from trainbox.health import histogram, logpoint
from trainbox.health.histogram import Logarithmic
from trainbox.health.logpoint import LogPointShare
from trainbox.health.step_clock import StepClock, StepTimes
from trainbox.logs import log

# The causes a straggler's time can have, each a part of its own time (StepTimes).
COMPUTE, DATA, OUTSIDE, PAUSED = "compute", "data wait", "outside the step", "paused"
# Steps a judged window spans at least: a log window of a few steps is mostly scheduling noise,
# so shorter ones add up until they reach this (every rank counts the same steps).
MIN_STEPS = 20
# Times per step: 8 bins per doubling from 1 µs to 1,000 s, with one bin below (zero included)
# and one above. A bin is 9 % wide: the medians are that exact.
STEP_TIMES = Logarithmic(low=1e-6, high=1000.0, per_octave=8)
# The parts of a rank's time shared as histograms, in this order (then the wait's total).
HISTOGRAMS = ("own", "compute", "data", "outside", "paused")
# Shared maxima: own (max, -min), compute (max, -min), data (max, -min), outside and paused
# (max), the slowest rank's own time and the slowest suspect's, each packed with its rank.
MAXES = 10
# What a rank shares at a log point that ends no judged window: nothing counted anywhere.
_EMPTY = LogPointShare(sums=(0.0,) * (len(HISTOGRAMS) * STEP_TIMES.bins + 1), maxes=(0.0,) * MAXES)
# The named rank's self-description: a fixed-size broadcast, so every rank knows its size.
DESCRIPTION_BYTES = 512


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """When a rank counts as slow (the `health` config's straggler keys)."""

    # Its own time per step over the median's by this factor...
    factor: float
    # ...and by at least this many seconds per step, so microsecond noise never counts...
    floor_s: float
    # ...for this many log windows in a row.
    windows: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Suspect:
    """The rank with the most own time among those slow for the windows before this one."""

    # Its global rank.
    rank: int
    # Its own time per step in this window.
    rank_s: float
    # The median rank's own time per step in this window.
    median_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Straggler:
    """A rank named slow: the others wait for it."""

    # Its global rank.
    rank: int
    # Its own time per step over the median's.
    ratio: float
    # Its own time per step in the window that named it.
    rank_s: float
    # The median rank's own time per step.
    median_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StragglerVerdict:
    """One log window's judgement, the same on every rank."""

    # The straggler of this window (None: none).
    straggler: Straggler | None
    # Whether it starts an episode (report it), rather than going on with the last one.
    new: bool


def over(rank_s: float, median_s: float, rule: Rule) -> bool:
    """Whether a time per step is slow against the median."""
    return rank_s > median_s * rule.factor and rank_s - median_s > rule.floor_s


def streak(before: int, rank_s: float, median_s: float, rule: Rule) -> int:
    """Windows in a row this rank has been slow, after one more window."""
    return before + 1 if over(rank_s, median_s, rule) else 0


def name_straggler(
    suspect: Suspect | None, *, previous: Straggler | None, rule: Rule
) -> StragglerVerdict:
    """The straggler of a window: the suspect (already slow for windows - 1 windows), if it is
    slow now; new unless the same rank goes on."""
    if suspect is None or not over(suspect.rank_s, suspect.median_s, rule):
        return StragglerVerdict(straggler=None, new=False)
    # A median of (almost) nothing counts as the finest bin.
    ratio = suspect.rank_s / max(suspect.median_s, STEP_TIMES.low)
    named = Straggler(rank=suspect.rank, ratio=ratio, rank_s=suspect.rank_s,
                      median_s=suspect.median_s)  # fmt: skip
    return StragglerVerdict(straggler=named, new=previous is None or previous.rank != named.rank)


def cause_of(mine: StepTimes, median: StepTimes) -> str:
    """Why a rank is the straggler: the part of its own time furthest over the median rank's
    (ties go to the first of compute, data wait, outside the step, paused)."""
    excess = {
        COMPUTE: mine.compute - median.compute,
        DATA: mine.data - median.data,
        OUTSIDE: mine.outside - median.outside,
        PAUSED: mine.paused - median.paused,
    }
    return max(excess, key=lambda cause: excess[cause])


def cause_text(cause: str, throttled: str) -> str:
    """The cause as reported: a compute straggler whose GPU clocks are held down says so."""
    return f"gpu throttle: {throttled}" if cause == COMPUTE and throttled else cause


def description(said: Mapping[str, Any]) -> bytes:
    """`said` as JSON within DESCRIPTION_BYTES: the least needed texts are emptied first when
    it is longer (JSON cut short would not parse)."""
    kept = dict(said)
    encoded = json.dumps(kept).encode()
    for name in ("cpus", "gpu", "throttle", "host"):
        if len(encoded) <= DESCRIPTION_BYTES:
            break
        kept[name] = ""
        encoded = json.dumps(kept).encode()
    return encoded[:DESCRIPTION_BYTES]


# Broadcasts `payload` (meaningful on rank `src` only) to every rank.
Exchange = Callable[[bytes, int], bytes]
# What the named rank says about itself: (host, CPU set, GPU, clock slowdown reasons).
Describe = Callable[[str], dict[str, str]]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimeSpread:
    """The job's step times in one window, read from the all-reduced share."""

    # The median rank's own time per step.
    own: float
    # The median of each part per step (wait: the mean over ranks).
    median: StepTimes
    # The fields the window's train line gets.
    train: dict[str, Any]

    @classmethod
    def of(cls, whole: LogPointShare) -> StepTimeSpread:
        """Medians from the summed histograms, extremes and the slowest rank from the maxima."""
        bins = STEP_TIMES.bins
        o_max, o_min, c_max, c_min, d_max, d_min, out_max, p_max, slowest = whole.maxes[:9]
        lows = {"own": -o_min, "compute": -c_min, "data": -d_min, "outside": 0.0, "paused": 0.0}
        highs = {"own": o_max, "compute": c_max, "data": d_max, "outside": out_max,
                 "paused": p_max}  # fmt: skip
        medians = {}
        for at, name in enumerate(HISTOGRAMS):
            counts = whole.sums[at * bins : (at + 1) * bins]
            medians[name] = histogram.median(counts, STEP_TIMES, low=lows[name], high=highs[name])
        ranks = sum(whole.sums[:bins])
        wait = whole.sums[len(HISTOGRAMS) * bins] / max(ranks, 1)
        named = logpoint.unpack(slowest)
        train = {
            "kind": "train",
            "own_s_p50": medians["own"],
            "own_s_max": o_max,
            "compute_s_min": -c_min,
            "compute_s_p50": medians["compute"],
            "compute_s_max": c_max,
            "data_s_p50": medians["data"],
            "data_s_max": d_max,
            "outside_s_p50": medians["outside"],
            "outside_s_max": out_max,
            "paused_s_p50": medians["paused"],
            "paused_s_max": p_max,
            "allreduce_wait_s_mean": wait,
            "slowest_rank": None if named is None else named[1],
        }
        median = StepTimes(compute=medians["compute"], data=medians["data"], wait=wait,
                           outside=medians["outside"], paused=medians["paused"])  # fmt: skip
        return cls(own=medians["own"], median=median, train=train)


class Stragglers:
    """The straggler detector: a logpoint.LogPointParticipant of StepMetrics, on every rank."""

    def __init__(
        self,
        clock: StepClock,
        *,
        rank: int,
        rule: Rule,
        exchange: Exchange,
        describe: Describe,
    ) -> None:
        self.clock, self.rank, self.rule = clock, rank, rule
        self.exchange, self.describe = exchange, describe
        # Windows in a row this rank's own time has been slow.
        self.streak = 0
        # This rank's times per step in the window being shared.
        self.mine = StepTimes(compute=0.0, data=0.0, wait=0.0, outside=0.0, paused=0.0)
        # The straggler of the last window, the same on every rank.
        self.current: Straggler | None = None

    def share(self) -> LogPointShare:
        """This window's histograms and, where slow before, this rank's suspect own time (all
        zero while the window is under MIN_STEPS steps: it goes on to the next log point)."""
        if self.clock.steps < MIN_STEPS:
            return _EMPTY
        mine = self.mine = self.clock.take().per_step()
        own, slowest = mine.own, logpoint.pack(mine.own, self.rank)
        suspect = slowest if self.streak >= self.rule.windows - 1 else 0.0
        parts = (own, mine.compute, mine.data, mine.outside, mine.paused)
        return LogPointShare(
            sums=(*histogram.one_hots(parts, STEP_TIMES), mine.wait),
            maxes=(own, -own, mine.compute, -mine.compute, mine.data, -mine.data, mine.outside,
                   mine.paused, slowest, suspect),
        )  # fmt: skip

    def records(self, whole: LogPointShare, *, step: int) -> list[dict[str, Any]]:
        """The train line's spread of step times; a straggler record when an episode starts.
        Nothing at a log point that ends no judged window (no rank counted a step)."""
        if not any(whole.sums):
            return []
        # Every rank is here at once (the all-reduce just returned): the next window starts.
        self.clock.window_starts()
        spread = StepTimeSpread.of(whole)
        unpacked = logpoint.unpack(whole.maxes[MAXES - 1])
        suspect = None if unpacked is None else Suspect(
            rank=unpacked[1], rank_s=unpacked[0], median_s=spread.own)  # fmt: skip
        self.streak = streak(self.streak, self.mine.own, spread.own, self.rule)
        verdict = name_straggler(suspect, previous=self.current, rule=self.rule)
        ended, self.current = self.current, verdict.straggler
        out = [spread.train]
        if verdict.new and verdict.straggler is not None:
            out.append(self._episode(verdict.straggler, spread, step))
        elif verdict.straggler is None and ended is not None and self.rank == ended.rank:
            log.info("straggler_recovered", rank=ended.rank, step=step)
        return out

    def _episode(self, found: Straggler, spread: StepTimeSpread, step: int) -> dict[str, Any]:
        """The named rank says why and describes itself to every rank (one broadcast) and
        warns; the record."""
        mine = found.rank == self.rank
        payload = b""
        if mine:
            cause = cause_of(self.mine, spread.median)
            parts = [self.mine.compute, self.mine.data, self.mine.outside, self.mine.paused]
            payload = description({**self.describe(cause), "cause": cause, "parts": parts})
        told: dict[str, Any] = json.loads(self.exchange(payload, found.rank) or b"{}")
        cause = cause_text(told.get("cause", ""), told.get("throttle", ""))
        compute, data, outside, paused = told.get("parts", [0.0] * 4)
        record: dict[str, Any] = {
            "kind": "straggler",
            "step": step,
            "rank": found.rank,
            "host": told.get("host", ""),
            "cause": cause,
            "ratio": round(found.ratio, 3),
            "median_s": found.median_s,
            "rank_s": found.rank_s,
            "compute_s": compute,
            "data_s": data,
            "outside_s": outside,
            "paused_s": paused,
            "windows": self.rule.windows,
            "cpus": told.get("cpus", ""),
            "gpu": told.get("gpu", ""),
            "time": time.time(),
        }
        if mine:
            log.warning(
                "straggler",
                message=f"rank {found.rank} ({record['host']}) is the slowest rank: the others"
                f" wait for it; its own time per step (all it does not spend waiting for them)"
                f" is {found.ratio:.1f}x the median's for {self.rule.windows} log windows;"
                f" likely cause: {cause}",
                **{k: v for k, v in record.items() if k not in ("kind", "time")},
            )
        return record


def broadcast(device: torch.device) -> Exchange:
    """Exchange over the default process group: one fixed-size broadcast from the named rank."""

    def exchange(payload: bytes, src: int) -> bytes:
        buffer = torch.zeros(DESCRIPTION_BYTES, dtype=torch.uint8)
        if payload:
            buffer[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        moved = buffer.to(device)
        torch_dist.broadcast(moved, src=src)
        return bytes(moved.cpu().tolist()).rstrip(b"\0")

    return exchange


def describer(device: torch.device, env: Mapping[str, str]) -> Describe:
    """This rank's self-description: host (as the hang watchdog names it), CPU set, GPU and,
    for a compute straggler on a GPU, its clock slowdown reasons from NVML (read only now)."""

    def describe(cause: str) -> dict[str, str]:
        said = {
            "host": platform.node()[:100],
            "cpus": format_cpulist(os.sched_getaffinity(0))[:200],
            "gpu": "",
            "throttle": "",
        }
        if device.type == "cuda":
            said["gpu"] = f"cuda:{device.index} {torch.cuda.get_device_name(device)}"[:100]
            if cause == COMPUTE:
                said["throttle"] = throttled(env, device.index or 0)[:100]
        return said

    return describe


def throttled(env: Mapping[str, str], index: int) -> str:
    """NVML's clock slowdown reasons for this process's GPU `index`, as preflight names them."""
    from trainbox.preflight import nvml
    from trainbox.preflight.checks import SLOWDOWNS

    gpus = nvml.survey(env).gpus
    reasons = gpus[index].clock_event_reasons if index < len(gpus) else None
    if not reasons:
        return ""
    return ", ".join(text for bit, text in SLOWDOWNS.items() if reasons & bit)
