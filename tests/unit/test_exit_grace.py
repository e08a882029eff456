"""exec's exit hook: a command's Python that used torch.distributed waits a moment at exit;
and trainbox's own commands leave without the interpreter's teardown while a thread is stranded
inside a collective.

Whether the abort these prevent happens is a race (benchmarks/exit_abort.py counts it over many
runs); these tests pin the mechanism: exec installs the hook, it runs after the script's own
exit hooks and only where torch.distributed was imported, and the sitecustomize it shadows
still runs; a stranded thread ends the process after its exit hooks, before the teardown.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainbox.process import exit_grace

from runs import clean_env

# The child replaces time.sleep to see the hook's call instead of waiting for it.
WATCH = (
    "import atexit, time\n"
    "time.sleep = lambda seconds: print('grace', seconds, flush=True)\n"
    "atexit.register(lambda: print('script hook', flush=True))\n"
)


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def with_hook(**extra: str) -> dict[str, str]:
    env = clean_env(**extra)
    return env | exit_grace.exported(env, grace_s=0.25)


def test_exec_installs_the_hook_in_its_command() -> None:
    code = "import os, sitecustomize; print(sitecustomize.__file__, os.environ['TRAINBOX_EXIT_GRACE_S'])"
    argv = [sys.executable, "-m", "trainbox", "exec", "--", sys.executable, "-c", code]
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, grace = proc.stdout.split()
    assert (Path(where).parent, grace) == (exit_grace.FOLDER, "0.1")


def test_the_hook_waits_after_the_scripts_own_exit_hooks() -> None:
    proc = python(f"import torch.distributed\n{WATCH}", with_hook())
    assert proc.stdout.splitlines() == ["script hook", "grace 0.25"], proc.stderr[-2000:]


def test_a_process_without_torch_distributed_leaves_at_once() -> None:
    proc = python(WATCH, with_hook())
    assert proc.stdout.splitlines() == ["script hook"], proc.stderr[-2000:]


def test_the_sitecustomize_it_shadows_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('theirs', flush=True)\n")
    proc = python("print('script')", with_hook(PYTHONPATH=str(tmp_path)))
    assert proc.stdout.splitlines() == ["theirs", "script"], proc.stderr[-2000:]


def test_no_grace_installs_nothing() -> None:
    assert exit_grace.exported({"PYTHONPATH": "/x"}, grace_s=0) == {}


def test_exec_with_no_grace_leaves_pythonpath_alone() -> None:
    code = "import os; print(os.environ.get('PYTHONPATH', '-'))"
    argv = [sys.executable, "-m", "trainbox", "exec", "dist.exit_grace_s=0", "--"]
    proc = subprocess.run([*argv, sys.executable, "-c", code], env=clean_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, f"{clean_env().get('PYTHONPATH', '-')}\n")


# A stranded thread, an exit hook, and an object whose finalizer shows a teardown happened.
STRANDED = (
    "import atexit, threading\n"
    "from trainbox.process import exit_grace\n"
    "class Torn:\n"
    "    def __del__(self): print('torn down', flush=True)\n"
    "kept = Torn()\n"
    "atexit.register(lambda: print('exit hooks ran', flush=True))\n"
    "thread = threading.Thread(target=threading.Event().wait, daemon=True)\n"
    "thread.start()\n"
    "exit_grace.strand(thread)\n"
    "import sys; print('unflushed', end='', file=sys.stderr)\n"
    "exit_grace.leave(4)\n"
    "print('went on')\n"
)


def test_a_stranded_thread_ends_the_process_after_its_exit_hooks_without_teardown() -> None:
    proc = python(STRANDED, clean_env())
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout.splitlines() == ["exit hooks ran"]
    assert proc.stderr == "unflushed"


def test_a_stranded_thread_that_ended_lets_the_process_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("trainbox.process.clean_exit._stranded", [])
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    exit_grace.strand(thread)
    assert not exit_grace.stranded()
    exit_grace.leave(4)  # returns: nothing could abort the teardown
