"""Fleet health: telemetry, the step clock and the straggler detector at the log points, and
the stop on a GPU fault."""

from trainbox.health.logpoint import LogPointShare
from trainbox.health.telemetry import Telemetry, for_rank

__all__ = ["LogPointShare", "Telemetry", "for_rank"]
