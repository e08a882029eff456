"""Work out which launcher started this process and where it sits in the job.

detection.py holds the rules' precedence; handoff.py reshapes a context for the processes it
starts.
"""

from __future__ import annotations

from trainbox.launch.context import LaunchContext
from trainbox.launch.detection import (
    LAUNCHERS,
    PRECEDENCE,
    Detector,
    detect,
    from_process,
    single,
)
from trainbox.launch.facts import HostFacts, gather
from trainbox.launch.handoff import exported, promote

__all__ = [
    "LAUNCHERS",
    "PRECEDENCE",
    "Detector",
    "HostFacts",
    "LaunchContext",
    "detect",
    "exported",
    "from_process",
    "gather",
    "promote",
    "single",
]
