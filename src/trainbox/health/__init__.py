"""GPU and process health during training: telemetry for the log points and the GPU fault stop."""

from trainbox.health.share import Share
from trainbox.health.telemetry import Telemetry, for_rank

__all__ = ["Share", "Telemetry", "for_rank"]
