"""`trainbox exec`'s exit hook (see trainbox.process.clean_exit), then the sitecustomize it shadows.

Python imports one `sitecustomize` at start-up, the first on sys.path: this one, put first by
exec. The one it hides (a distribution's or the user's) is found further down and run too.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import importlib.util
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def _grace() -> None:
    # Only a process that imported torch.distributed can have a gloo worker to wait for.
    if "torch.distributed" not in sys.modules:
        return
    try:
        seconds = float(os.environ.get("TRAINBOX_EXIT_GRACE_S", "0"))
    except ValueError:
        return
    if seconds > 0:
        time.sleep(seconds)


def _run_the_shadowed_one() -> None:
    rest = [path for path in sys.path if os.path.abspath(path or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


# Registered before any other exit hook, so it runs after all of them.
atexit.register(_grace)
_run_the_shadowed_one()
