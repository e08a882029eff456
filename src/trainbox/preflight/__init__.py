"""Checks that a node can run its share of the job: NVML facts and node facts, judged purely.

checks.py judges, report.py applies the run's policy to the findings; each check is declared
once in config/preflight_checks.py.
"""

from __future__ import annotations

from trainbox.preflight.checks import Check, Expectations, NodeFacts, judge
from trainbox.preflight.facts import cpu_only
from trainbox.preflight.report import Report, worth_logging

__all__ = ["Check", "Expectations", "NodeFacts", "Report", "cpu_only", "judge", "worth_logging"]
