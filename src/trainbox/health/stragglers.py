"""Straggler detection: a synchronous job runs at its slowest rank's speed; name that rank.

At each log point every rank shares (a LogPointShare) histograms of its own work and data wait
per step, and, packed with its rank, its times where it has been slow for the windows before: one
SUM and one MAX give every rank the same medians and the same slowest suspect. `name_straggler`
names a rank slower than the median by `health.straggler_factor` for `health.straggler_windows`
windows in a row, once per episode. The named rank then describes itself (host, CPUs, GPU and, on a
GPU, NVML's clock event reasons) in one broadcast and logs the warning; rank 0 writes the record.
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
from trainbox.health.step_clock import StepClock
from trainbox.logs import log

COMPUTE, DATA = "compute", "data wait"
# Steps a judged window spans at least: a log window of a few steps is mostly scheduling noise,
# so shorter ones add up until they reach this (every rank counts the same steps).
MIN_STEPS = 20
# What a rank shares at a log point that ends no judged window: nothing counted anywhere.
# Times per step: 8 bins per doubling from 1 µs to 1,000 s, with one bin below (zero included)
# and one above. A bin is 9 % wide: the medians are that exact.
STEP_TIMES = Logarithmic(low=1e-6, high=1000.0, per_octave=8)
_EMPTY = LogPointShare(sums=(0.0,) * (2 * STEP_TIMES.bins + 1), maxes=(0.0,) * 7)
# The named rank's self-description: a fixed-size broadcast, so every rank knows its size.
DESCRIPTION_BYTES = 512


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """When a rank counts as slow (the `health` config's straggler keys)."""

    # Slower than the median by this factor...
    factor: float
    # ...and by at least this many seconds per step, so microsecond noise never counts...
    floor_s: float
    # ...for this many log windows in a row.
    windows: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Suspect:
    """The slowest rank among those slow for the windows before this one, for one cause."""

    # Its global rank.
    rank: int
    # Its time per step in this window.
    rank_s: float
    # The median rank's time per step in this window.
    median_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Straggler:
    """A rank named slow, and why."""

    # Its global rank.
    rank: int
    # COMPUTE or DATA.
    cause: str
    # Its time per step over the median's.
    ratio: float
    # Its time per step (for the cause) in the window that named it.
    rank_s: float
    # The median rank's time per step for the same cause.
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
    suspects: Mapping[str, Suspect | None], *, previous: Straggler | None, rule: Rule
) -> StragglerVerdict:
    """The straggler of a window: the suspect (already slow for windows - 1 windows) that is
    slow now, with the larger ratio of the two causes; new unless the same rank goes on."""
    named: Straggler | None = None
    for cause, suspect in suspects.items():
        if suspect is None or not over(suspect.rank_s, suspect.median_s, rule):
            continue
        # A median of no wait at all (below the finest bin) counts as the finest bin.
        ratio = suspect.rank_s / max(suspect.median_s, STEP_TIMES.low)
        if named is None or ratio > named.ratio:
            named = Straggler(rank=suspect.rank, cause=cause, ratio=ratio,
                              rank_s=suspect.rank_s, median_s=suspect.median_s)  # fmt: skip
    new = named is not None and (previous is None or previous.rank != named.rank)
    return StragglerVerdict(straggler=named, new=new)


def cause_text(cause: str, throttled: str) -> str:
    """The cause as reported: a compute straggler whose GPU clocks are held down says so."""
    return f"gpu throttle: {throttled}" if cause == COMPUTE and throttled else cause


# Broadcasts `payload` (meaningful on rank `src` only) to every rank.
Exchange = Callable[[bytes, int], bytes]
# What the named rank says about itself: (host, CPU set, GPU, clock slowdown reasons).
Describe = Callable[[str], dict[str, str]]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimeSpread:
    """The job's step times in one window, read from the all-reduced share."""

    # The median rank's time per step, per cause.
    medians: dict[str, float]
    # The fields the window's train line gets.
    train: dict[str, Any]

    @classmethod
    def of(cls, whole: LogPointShare) -> StepTimeSpread:
        """Medians from the summed histograms, extremes and the slowest rank from the maxima."""
        bins = STEP_TIMES.bins
        c_max, c_min, d_max, d_min, slowest = whole.maxes[:5]
        compute = histogram.median(whole.sums[:bins], STEP_TIMES, low=-c_min, high=c_max)
        data = histogram.median(whole.sums[bins : 2 * bins], STEP_TIMES, low=-d_min, high=d_max)
        ranks = sum(whole.sums[:bins])
        named = logpoint.unpack(slowest)
        train = {
            "kind": "train",
            "compute_s_min": -c_min,
            "compute_s_p50": compute,
            "compute_s_max": c_max,
            "data_s_p50": data,
            "data_s_max": d_max,
            "allreduce_wait_s_mean": whole.sums[2 * bins] / max(ranks, 1),
            "slowest_rank": None if named is None else named[1],
        }
        return cls(medians={COMPUTE: compute, DATA: data}, train=train)


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
        # Windows in a row this rank has been slow, per cause.
        self.streaks = {COMPUTE: 0, DATA: 0}
        # This rank's times per step in the window being shared, per cause.
        self.mine = {COMPUTE: 0.0, DATA: 0.0}
        # The straggler of the last window, the same on every rank.
        self.current: Straggler | None = None

    def share(self) -> LogPointShare:
        """This window's histograms and, where slow before, this rank's suspect times (all
        zero while the window is under MIN_STEPS steps: it goes on to the next log point)."""
        if self.clock.steps < MIN_STEPS:
            return _EMPTY
        compute, data, wait = self.clock.take().per_step()
        self.mine = {COMPUTE: compute, DATA: data}
        ready = self.rule.windows - 1

        def suspect(cause: str) -> float:
            slow = self.streaks[cause] >= ready
            return logpoint.pack(self.mine[cause], self.rank) if slow else 0.0

        return LogPointShare(
            sums=(*histogram.one_hot(compute, STEP_TIMES),
                  *histogram.one_hot(data, STEP_TIMES), wait),
            maxes=(compute, -compute, data, -data, logpoint.pack(compute, self.rank),
                   suspect(COMPUTE), suspect(DATA)),
        )  # fmt: skip

    def records(self, whole: LogPointShare, *, step: int) -> list[dict[str, Any]]:
        """The train line's spread of step times; a straggler record when an episode starts.
        Nothing at a log point that ends no judged window (no rank counted a step)."""
        if not any(whole.sums):
            return []
        spread = StepTimeSpread.of(whole)
        suspects = {}
        for cause, packed in zip((COMPUTE, DATA), whole.maxes[5:], strict=True):
            unpacked = logpoint.unpack(packed)
            suspects[cause] = None if unpacked is None else Suspect(
                rank=unpacked[1], rank_s=unpacked[0], median_s=spread.medians[cause])  # fmt: skip
        for cause, mine in self.mine.items():
            self.streaks[cause] = streak(self.streaks[cause], mine, spread.medians[cause],
                                         self.rule)  # fmt: skip
        verdict = name_straggler(suspects, previous=self.current, rule=self.rule)
        ended, self.current = self.current, verdict.straggler
        out = [spread.train]
        if verdict.new and verdict.straggler is not None:
            out.append(self._episode(verdict.straggler, step))
        elif verdict.straggler is None and ended is not None and self.rank == ended.rank:
            log.info("straggler_recovered", rank=ended.rank, step=step)
        return out

    def _episode(self, found: Straggler, step: int) -> dict[str, Any]:
        """The named rank describes itself to every rank (one broadcast) and warns; the record."""
        mine = found.rank == self.rank
        said = self.describe(found.cause) if mine else {}
        payload = json.dumps(said).encode()[:DESCRIPTION_BYTES] if mine else b""
        told: dict[str, str] = json.loads(self.exchange(payload, found.rank) or b"{}")
        cause = cause_text(found.cause, told.get("throttle", ""))
        record: dict[str, Any] = {
            "kind": "straggler",
            "step": step,
            "rank": found.rank,
            "host": told.get("host", ""),
            "cause": cause,
            "ratio": round(found.ratio, 3),
            "median_s": found.median_s,
            "rank_s": found.rank_s,
            "windows": self.rule.windows,
            "cpus": told.get("cpus", ""),
            "gpu": told.get("gpu", ""),
            "time": time.time(),
        }
        if mine:
            log.warning(
                "straggler",
                message=f"rank {found.rank} ({record['host']}) is the slowest rank: its"
                f" {found.cause} takes {found.ratio:.1f}x the median per step for"
                f" {self.rule.windows} log windows; likely cause: {cause}",
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
