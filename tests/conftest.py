"""Shared test plumbing: the tier switch lives in tests/tiers.py."""

from __future__ import annotations

import sys
from pathlib import Path

# tests import helpers such as `tiers` and `launchers.slurm_cluster` by plain name.
sys.path.insert(0, str(Path(__file__).parent))
