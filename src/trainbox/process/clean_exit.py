"""A clean exit past torch's gloo threads: a moment's grace at the exit of a command behind
`trainbox exec`, and leaving early while a thread of ours is stranded in a collective.

A process group that outlives `destroy_process_group()` (DDP's reducer holds it until the
interpreter's own last collection) keeps gloo's worker thread running. That thread frees its
last work, and the tensors in it, after the script's final barrier; freeing a tensor takes the
GIL, and if Python has begun finalizing by then, Python kills the thread mid-destructor and the
process aborts (SIGABRT, "terminate called without an active exception"), so Slurm and
Kubernetes mark a finished job FAILED. torch checks neither (pytorch/pytorch#190489).

exec puts the exit_grace/ folder first on the command's PYTHONPATH, so its `sitecustomize`
registers an exit hook that sleeps `dist.exit_grace_s` in a process that imported
torch.distributed: registered first, it runs after every other exit hook, while the interpreter
is still whole, and lets the waiting thread finish. benchmarks/exit_abort.py measures the effect.

trainbox's own commands know when a thread of theirs is still inside a collective at exit: a
rank leaving on a failure while a peer holds the stop vote. Waiting for it could take the
group's whole timeout (600 s by default), so the thread is marked stranded and the command
ends without tearing down the interpreter (`leave`), as the hang watchdog already does.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

# The exit hook reads its grace from here.
GRACE_VAR = "TRAINBOX_EXIT_GRACE_S"
# The folder with the `sitecustomize` to put first on PYTHONPATH.
FOLDER = Path(__file__).resolve().parent / "exit_grace"


def exported(env: Mapping[str, str], *, grace_s: float) -> dict[str, str]:
    """The variables that install the exit hook in a command's Python; none for no grace."""
    if grace_s <= 0:
        return {}
    paths = [str(FOLDER), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), GRACE_VAR: f"{grace_s:g}"}


# Threads left inside a torch.distributed call that may return while Python finalizes.
_stranded: list[threading.Thread] = []


def strand(thread: threading.Thread) -> None:
    """Mark a thread that is still inside a collective and will not be waited for."""
    _stranded.append(thread)


def stranded() -> bool:
    """Whether a marked thread is still running."""
    return any(thread.is_alive() for thread in _stranded)


def leave(code: int) -> None:
    """End the process with `code` now if a stranded thread could abort its teardown."""
    if not stranded():
        return
    # What a normal exit does first: exit hooks (metrics sinks drain and close), then the
    # streams. Only the interpreter's teardown, where the thread would abort us, is skipped.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
