"""The unit-test fixtures in tests/unit/envs are what the real launchers still produce here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tiers
from launchers import capture
from launchers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

# Values that differ on every run (ids, ports, pids, paths) are not compared, only the names.
CASES = {case.name: case for case in capture.CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fresh_capture_has_the_recorded_variable_names(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    case = CASES[name]
    if name.startswith("mpirun"):
        tiers.require_commands("mpirun")
    cluster: SlurmCluster | None = (
        request.getfixturevalue("slurm_cluster") if case.needs_slurm else None
    )
    fresh = capture.capture(case, tmp_path, cluster)
    recorded = json.loads((capture.FIXTURES / f"{name}.json").read_text())["processes"]
    assert [sorted(env) for env in fresh] == [sorted(env) for env in recorded]
