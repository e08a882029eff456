"""run_dir's lock: one holder at a time, named; free again on release or on the holder's death."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from trainbox.train.resume import run_dir
from trainbox.train.resume.run_dir import Lock, LockHolder


def test_a_second_taker_gets_the_holder_instead(tmp_path: Path) -> None:
    first = run_dir.acquire_lock(tmp_path)
    assert isinstance(first, Lock)
    second = run_dir.acquire_lock(tmp_path)
    assert isinstance(second, LockHolder)
    assert (second.host, second.pid) == (platform.node(), os.getpid())
    first.release()


def test_release_lets_the_next_run_in_and_empties_the_record(tmp_path: Path) -> None:
    first = run_dir.acquire_lock(tmp_path)
    assert isinstance(first, Lock)
    first.release()
    first.release()  # idempotent
    assert (tmp_path / run_dir.LOCK_NAME).read_text() == ""
    again = run_dir.acquire_lock(tmp_path)
    assert isinstance(again, Lock)
    again.release()


HOLD = """
import sys, time
from pathlib import Path
from trainbox.train.resume import run_dir
lock = run_dir.acquire_lock(Path(sys.argv[1]))
print(type(lock).__name__, flush=True)
time.sleep(600)
"""


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "Lock"
        busy = run_dir.acquire_lock(tmp_path)
        assert isinstance(busy, LockHolder)
        assert busy.pid == holder.pid
        assert f"pid {holder.pid}" in busy.describe()
    finally:
        holder.kill()
        holder.wait()
    # The record still names the dead holder; the kernel dropped its flock all the same.
    taken = run_dir.acquire_lock(tmp_path)
    assert isinstance(taken, Lock)
    taken.release()


def test_an_unlinked_lock_file_is_not_a_lock(tmp_path: Path) -> None:
    first = run_dir.acquire_lock(tmp_path)
    assert isinstance(first, Lock)
    # The holder cleans up a directory it made; a newcomer must lock the file now named.
    (tmp_path / run_dir.LOCK_NAME).unlink()
    first.release()
    second = run_dir.acquire_lock(tmp_path)
    assert isinstance(second, Lock)
    assert isinstance(run_dir.acquire_lock(tmp_path), LockHolder)
    second.release()


def test_a_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    # A DataLoader worker that outlives its rank 0 must not hold the run_dir against the next.
    lock = run_dir.acquire_lock(tmp_path)
    assert isinstance(lock, Lock)
    hold_r, hold_w = os.pipe()
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only says it runs, then waits
        os.close(hold_w)
        os.write(ready_w, b"r")
        os.read(hold_r, 1)
        os._exit(0)
    # Once the child runs its own code, its fork handlers have run.
    os.read(ready_r, 1)
    try:
        lock.release()
        taken = run_dir.acquire_lock(tmp_path)
        assert isinstance(taken, Lock)
        taken.release()
    finally:
        os.close(hold_w)
        os.waitpid(child, 0)
        for fd in (hold_r, ready_r, ready_w):
            os.close(fd)
