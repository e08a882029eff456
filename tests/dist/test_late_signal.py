"""A stop signal that arrives once the work is done (summary.json written) changes nothing:
the run still exits 0. Only a run that stopped early exits 143.

Real runs: one process, and node mode (trainbox supervising torchrun with 2 workers). From the
moment summary.json exists the test keeps sending the signal every few milliseconds until the
process has exited, so the whole way out (teardown, interpreter shutdown) is covered.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from runs import QUICK, clean_env, trainbox_argv

pytestmark = pytest.mark.slow


def signal_until_exit(argv: list[str], run_dir: Path, sig: signal.Signals) -> tuple[int, int, str]:
    """Run argv; once summary.json exists, send `sig` repeatedly. (exit code, signals, stderr)."""
    proc = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    assert proc.stderr is not None
    # The summary is the last file written: polled, as no process event marks it.
    while not (run_dir / "summary.json").exists() and proc.poll() is None:
        time.sleep(0.002)
    sent = 0
    while proc.poll() is None:
        proc.send_signal(sig)
        sent += 1
        time.sleep(0.002)
    return proc.wait(), sent, proc.stderr.read()


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["USR1", "TERM"])
def test_a_late_signal_leaves_a_finished_run_at_exit_0(tmp_path: Path, sig: signal.Signals) -> None:
    argv = trainbox_argv(1, "run", f"run_dir={tmp_path}", *QUICK)
    code, sent, stderr = signal_until_exit(argv, tmp_path, sig)
    assert sent > 0, "the run ended before the test could signal it"
    assert code == 0, stderr[-3000:]


def test_a_late_signal_leaves_a_finished_node_at_exit_0(tmp_path: Path) -> None:
    argv = trainbox_argv(1, "run", f"run_dir={tmp_path}", *QUICK, "dist.procs_per_node=2")
    code, sent, stderr = signal_until_exit(argv, tmp_path, signal.SIGUSR1)
    assert sent > 0, "the run ended before the test could signal it"
    assert code == 0, stderr[-3000:]
