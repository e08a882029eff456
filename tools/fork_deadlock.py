"""Does this Python's fork deadlock (python/cpython#112275), and does trainbox's loader survive it?

    .venv/bin/python tools/fork_deadlock.py forks 3000       # bare os.fork children that hang
    .venv/bin/python tools/fork_deadlock.py loaders 1000     # train/data/workers.py's loaders

Two native threads keep making and dropping Python thread states (a ctypes callback on a fresh
pthread, as gloo's run loop does when it takes the GIL), which takes the interpreter's
thread-list lock without the GIL. `forks` forks bare children meanwhile and counts those still
alive after 2 s; `loaders` iterates one-worker CheckedLoaders and counts the stuck workers they
replaced. Prints one JSON line.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from typing import Any

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def _nothing(_arg: Any) -> None:
    return None


def _churn(stop: threading.Event) -> None:
    libc = ctypes.CDLL(None)
    callback = _CALLBACK(_nothing)
    thread = ctypes.c_ulong()
    while not stop.is_set():
        # ctypes releases the GIL around both calls; the callback's thread has no thread state.
        libc.pthread_create(ctypes.byref(thread), None, callback, None)
        libc.pthread_join(thread, None)


def _forks(count: int) -> dict[str, Any]:
    hung = 0
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        deadline = time.monotonic() + 2
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                hung += 1
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.001)
    return {"forks": count, "children_hung": hung}


def _loaders(count: int) -> dict[str, Any]:
    import structlog
    import torch
    from torch.utils.data import DataLoader

    from trainbox.train.data.workers import CheckedLoader

    replaced = 0

    def counted(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        nonlocal replaced
        replaced += len(event.get("pids", ()))
        raise structlog.DropEvent

    structlog.configure(processors=[counted])
    data = torch.arange(8)
    for _ in range(count):
        loader = CheckedLoader(
            lambda init: DataLoader(data, batch_size=4, num_workers=1, worker_init_fn=init),
            stuck_after_s=1.0,
        )
        assert sum(int(batch.sum()) for batch in loader) == 28
    return {"loaders": count, "stuck_workers_replaced": replaced}


def main(argv: list[str]) -> int:
    mode, count = argv[0], int(argv[1])
    stop = threading.Event()
    for _ in range(2):
        threading.Thread(target=_churn, args=(stop,), daemon=True).start()
    result = _forks(count) if mode == "forks" else _loaders(count)
    stop.set()
    print(json.dumps({"python": sys.version.split()[0], **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
