"""Preemption requests: the Slurm deadline (pure) and the signal handlers (real signals)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from trainbox.errors import UsageError
from trainbox.process import preempt

NOW = time.time()


@pytest.mark.parametrize(
    ("env", "margin", "expected"),
    [
        ({}, 300, None),
        ({"SLURM_JOB_END_TIME": ""}, 300, None),
        ({"SLURM_JOB_END_TIME": str(int(NOW) + 3600)}, 300, int(NOW) + 3300),
        ({"SLURM_JOB_END_TIME": str(int(NOW) + 3600)}, 0, int(NOW) + 3600),
        # Slurm's "no limit" values are no deadline.
        ({"SLURM_JOB_END_TIME": "0"}, 300, None),
        ({"SLURM_JOB_END_TIME": "4294967294"}, 300, None),
        # A supervised worker leaves the deadline to its node's supervisor.
        ({"SLURM_JOB_END_TIME": str(int(NOW) + 3600), "TRAINBOX_SUPERVISED": "1"}, 300, None),
    ],
    # Not the values: they hold the clock, and xdist's workers must collect the same ids.
    ids=["unset", "empty", "an-hour-left", "no-margin", "zero", "far-future", "supervised"],
)
def test_deadline(env: dict[str, str], margin: float, expected: float | None) -> None:
    assert preempt.deadline(env, margin_s=margin) == expected


def test_a_malformed_end_time_names_the_variable() -> None:
    with pytest.raises(UsageError, match="SLURM_JOB_END_TIME='soon'"):
        preempt.deadline({"SLURM_JOB_END_TIME": "soon"}, margin_s=300)


@pytest.fixture
def requests() -> Iterator[preempt.StopRequests]:
    caught = preempt.StopRequests()
    restore = caught.install()
    yield caught
    restore()


def test_no_signal_no_request(requests: preempt.StopRequests) -> None:
    assert requests.code == 0


@pytest.mark.parametrize(
    ("sig", "reason"), [(signal.SIGUSR1, "SIGUSR1"), (signal.SIGTERM, "SIGTERM")]
)
def test_a_stop_signal_is_recorded_not_fatal(
    requests: preempt.StopRequests, sig: int, reason: str
) -> None:
    os.kill(os.getpid(), sig)
    assert preempt.REASONS[requests.code] == reason


def test_the_strongest_reason_is_kept(requests: preempt.StopRequests) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert preempt.REASONS[requests.code] == "SIGTERM"


def test_restore_puts_the_old_handlers_back() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    restore = preempt.StopRequests().install()
    assert signal.getsignal(signal.SIGUSR1) != before
    restore()
    assert signal.getsignal(signal.SIGUSR1) == before
