"""Before `trainbox exec` hands over, every rank meets at the master: a busy port or a lost rank
ends each rank with a line naming the master, inside dist.timeout_s, never a silent wait.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from freeport import free_port
from runs import clean_env

pytestmark = pytest.mark.slow

TIMEOUT_S = 3
# Process start and the torch import, on top of the timeout itself.
MARGIN_S = 20
# The user's command: joins the process group itself on the same MASTER_PORT, all-reduces
# its rank, and leaves a marker so a test can tell whether it ever ran.
SCRIPT = """
import os, sys, torch, torch.distributed as dist
open(sys.argv[1], "w").close()
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print("sum", int(total.item()), "world", dist.get_world_size())
dist.destroy_process_group()
"""


def start_ranks(
    tmp_path: Path, port: int, *, ranks: Sequence[int] = (0, 1), world: int = 2
) -> list[tuple[subprocess.Popen[str], Path]]:
    """`trainbox exec -- python SCRIPT MARKER` as `ranks` of an env:// job on `port`."""
    started = []
    for rank in ranks:
        env = clean_env(
            RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        marker = tmp_path / f"ran-{rank}"
        argv = [sys.executable, "-m", "trainbox", "exec", f"dist.timeout_s={TIMEOUT_S}", "--"]
        argv += [sys.executable, "-c", SCRIPT, str(marker)]
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append((proc, marker))
    return started


def finish(started: list[tuple[subprocess.Popen[str], Path]]) -> list[tuple[int, str, str, bool]]:
    """Each rank's (exit code, stdout, its trainbox line, whether the command ran)."""
    results = []
    for proc, marker in started:
        out, err = proc.communicate(timeout=TIMEOUT_S + MARGIN_S + 30)
        lines = [line for line in err.splitlines() if line.startswith("trainbox: error:")]
        results.append((proc.returncode, out, lines[-1] if lines else err[-2000:], marker.exists()))
    return results


def test_the_ranks_meet_then_the_command_uses_the_same_port(tmp_path: Path) -> None:
    results = finish(start_ranks(tmp_path, free_port()))
    assert [(code, out, ran) for code, out, _, ran in results] == [
        (0, "sum 1 world 2\n", True),
        (0, "sum 1 world 2\n", True),
    ], results


def test_a_busy_master_port_fails_preflight_on_the_stores_host(
    tmp_path: Path, busy_port: int
) -> None:
    started = time.monotonic()
    (code, _, line, ran), (code1, _, line1, ran1) = finish(start_ranks(tmp_path, busy_port))
    assert (code, ran) == (3, False), line
    assert f"127.0.0.1:{busy_port}" in line
    assert "HINT:" in line
    # The other rank reaches a stranger at that port: it gives up in time, naming the master.
    assert (code1, ran1) == (4, False), line1
    assert f"127.0.0.1:{busy_port}" in line1
    assert time.monotonic() - started < TIMEOUT_S + MARGIN_S


def test_a_rank_whose_master_never_comes_gives_up_naming_it(tmp_path: Path) -> None:
    port = free_port()
    started = time.monotonic()
    ((code, _, line, ran),) = finish(start_ranks(tmp_path, port, ranks=(1,)))
    assert (code, ran) == (4, False), line
    assert f"rank 1 could not reach the master at 127.0.0.1:{port} within {TIMEOUT_S} s" in line
    assert time.monotonic() - started < TIMEOUT_S + MARGIN_S


def test_a_master_whose_peers_never_come_gives_up_counting_them(tmp_path: Path) -> None:
    ((code, _, line, ran),) = finish(start_ranks(tmp_path, free_port(), ranks=(0,)))
    assert (code, ran) == (4, False), line
    assert "only 1 of 2 ranks reached the master 127.0.0.1:" in line
