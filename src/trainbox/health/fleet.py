"""This rank's part in fleet health, built in one place: the step clock, and the participants
that ride the log point (the straggler detector and GPU telemetry), as `health` configures them.

A new participant is added here and nowhere else: the loop takes whatever list this gives.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from trainbox.config import HealthConfig
from trainbox.health import step_clock, stragglers, telemetry
from trainbox.health.logpoint import LogPointParticipant
from trainbox.preflight.facts import GpuSurvey


@dataclass(frozen=True, kw_only=True, slots=True)
class Fleet:
    """What this rank adds to the fleet's health."""

    # The `health` config section.
    config: HealthConfig
    # This process's rank.
    rank: int
    # This rank's device (a CUDA clock times with events).
    device: torch.device
    # The running GPU sampler (runtime starts and stops it around the fit); None: off.
    telemetry: telemetry.Telemetry | None = None
    # The environment, where a straggler's self-description reads its host and GPU.
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    @classmethod
    def for_rank(
        cls,
        config: HealthConfig,
        *,
        rank: int,
        device: torch.device,
        survey: GpuSurvey,
        gpu_ordinal: int,
        on_fault: Callable[[str], None],
    ) -> Fleet:
        """This rank's part, with telemetry sampling its GPU (`gpu_ordinal` in the survey's
        CUDA order) and reporting a fault to `on_fault`; not started yet."""
        sampler = telemetry.for_rank(
            config, survey=survey, gpu_ordinal=gpu_ordinal, rank=rank, on_fault=on_fault
        )
        return cls(config=config, rank=rank, device=device, telemetry=sampler)

    def start(self) -> None:
        """Start what samples in the background (telemetry's thread)."""
        if self.telemetry is not None:
            self.telemetry.start()

    def stop(self) -> None:
        """Stop what `start` started."""
        if self.telemetry is not None:
            self.telemetry.stop()

    def clock_for(self, module: torch.nn.Module) -> step_clock.StepClock:
        """Where each step's time goes on this rank; it only keeps time if something reads it."""
        return step_clock.clock_for(module, self.device, read=self.config.stragglers)

    def participants(self, clock: step_clock.StepClock) -> list[LogPointParticipant]:
        """The log point's participants, in the order their shares join its all-reduce."""
        parts: list[LogPointParticipant] = []
        if self.config.stragglers:
            parts.append(self._stragglers(clock))
        if self.telemetry is not None:
            parts.append(self.telemetry)
        return parts

    def _stragglers(self, clock: step_clock.StepClock) -> stragglers.Stragglers:
        rule = stragglers.Rule(
            factor=self.config.straggler_factor,
            floor_s=self.config.straggler_floor_ms / 1e3,
            windows=self.config.straggler_windows,
        )
        return stragglers.Stragglers(
            clock,
            rank=self.rank,
            rule=rule,
            exchange=stragglers.broadcast(self.device),
            describe=stragglers.describer(self.device, self.env),
        )
