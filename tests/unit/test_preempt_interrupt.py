"""Ctrl-C is a stop request like SIGTERM; a second Ctrl-C aborts at once (issue 19, item 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from trainbox.process import preempt


@pytest.fixture
def requests() -> Iterator[preempt.StopRequests]:
    caught = preempt.StopRequests()
    restore = caught.install()
    yield caught
    restore()


def test_ctrl_c_is_recorded_as_a_stop_request(requests: preempt.StopRequests) -> None:
    os.kill(os.getpid(), signal.SIGINT)
    assert preempt.REASONS[requests.code] == "SIGINT"


def test_restore_puts_the_old_sigint_handler_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    restore = preempt.StopRequests().install()
    assert signal.getsignal(signal.SIGINT) != before
    restore()
    assert signal.getsignal(signal.SIGINT) == before


# A process that asks for a stop, then sleeps where a long step or a hung collective would be.
CHILD = """
import os, signal, sys, time
from trainbox.process import preempt
requests = preempt.StopRequests()
requests.install()
os.kill(os.getpid(), signal.SIGINT)
os.kill(os.getpid(), signal.SIGINT)  # torchrun's echo of the same Ctrl-C: no abort
print(preempt.REASONS[requests.code], flush=True)
time.sleep(preempt.ECHO_S)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(30)
sys.exit(0)
"""


def test_a_second_ctrl_c_aborts_at_once() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=20, check=False
    )
    assert proc.stdout == "SIGINT\n"
    # Killed by the signal itself, as a shell reports it: 130.
    assert proc.returncode == -signal.SIGINT
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2
    assert "press Ctrl-C again to abort at once" in lines[0]
    assert "aborting now, without a checkpoint" in lines[1]


@pytest.mark.parametrize(
    ("first_at", "now", "action"),
    [
        (None, 100.0, "stop"),
        (100.0, 100.1, "echo"),
        (100.0, 101.9, "echo"),
        (100.0, 102.0, "abort"),
    ],
)
def test_what_a_ctrl_c_means(first_at: float | None, now: float, action: str) -> None:
    assert preempt.ctrl_c_action(first_at, now, echo_s=2.0) == action
