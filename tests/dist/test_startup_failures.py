"""Start-up failures end with exit 4 inside the configured timeout, naming address and port."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from freeport import free_port
from runs import QUICK, clean_env, trainbox_argv

pytestmark = pytest.mark.slow

TIMEOUT_S = 3
# torch import and process start, on top of the rendezvous timeout itself.
MARGIN_S = 20


def start_rank(tmp_path: Path, rank: int, port: int) -> subprocess.CompletedProcess[str]:
    env = clean_env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    argv = trainbox_argv(1, "run", f"run_dir={tmp_path}", *QUICK, f"dist.timeout_s={TIMEOUT_S}")
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error:")]
    return line


def test_a_rank_that_cannot_reach_the_master(tmp_path: Path) -> None:
    port = free_port()  # nobody listens: rank 0 never started
    started = time.monotonic()
    proc = start_rank(tmp_path, 1, port)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert time.monotonic() - started < TIMEOUT_S + MARGIN_S
    assert (
        f"rank 1 could not reach the master at 127.0.0.1:{port} within {TIMEOUT_S} s"
        in error_line(proc)
    )


def test_a_missing_peer(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = start_rank(tmp_path, 0, free_port())  # rank 1 never comes
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert time.monotonic() - started < TIMEOUT_S + MARGIN_S
    assert "only 1 of 2 ranks reached the master 127.0.0.1:" in error_line(proc)


def test_a_port_already_in_use(tmp_path: Path, busy_port: int) -> None:
    proc = start_rank(tmp_path, 0, busy_port)
    assert proc.returncode == 4, proc.stderr[-2000:]
    line = error_line(proc)
    assert f"port {busy_port} is already in use" in line
    assert "HINT: " in line
