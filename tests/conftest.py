"""Shared test plumbing: the tier switch lives in tests/tiers.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests import helpers such as `tiers` and `launchers.slurm_cluster` by plain name.
sys.path.insert(0, str(Path(__file__).parent))

import tiers
from launchers.slurm_cluster import SlurmCluster, missing_requirements, start_cluster

# Job steps must run this venv's python; srun/sbatch pass the caller's PATH on to them.
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real two-node (n1, n2) Slurm cluster on loopback for the whole session."""
    reason = missing_requirements()
    if reason is not None:
        tiers.unavailable(reason)
    with start_cluster(tmp_path_factory.mktemp("slurm"), python_bin_dir=VENV_BIN) as cluster:
        yield cluster


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another program listens on (and accepts on, saying nothing)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    """Tests that run the CLI in-process leave its handlers (SIG_IGN at exit) to no other test."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


# Every tier must be collected in CI: a directory pytest quietly ignores would pass as green.
TIERS = ("unit", "dist", "launchers", "manifests", "container")


def pytest_collection_finish(session: pytest.Session) -> None:
    """With TRAINBOX_REQUIRE_ALL=1 and the whole suite selected, fail if a tier collects nothing."""
    if not tiers.REQUIRE_ALL or session.config.args not in ([], ["tests"]):
        return
    tests_dir = Path(__file__).parent
    seen = {Path(item.path).relative_to(tests_dir).parts[0] for item in session.items}
    missing = [tier for tier in TIERS if tier not in seen]
    if missing:
        raise pytest.UsageError(f"no tests collected from tests/{', tests/'.join(missing)}")
