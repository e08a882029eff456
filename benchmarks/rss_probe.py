"""Run a Python module or script as this process and record its peak RSS when it exits.

    torchrun ... benchmarks/rss_probe.py OUT_DIR -m trainbox run ...
    torchrun ... benchmarks/rss_probe.py OUT_DIR benchmarks/raw_fsdp.py ...

Each rank writes OUT_DIR/rank-RANK.json: {"rank", "peak_rss_mib"} (ru_maxrss of this process,
which is the rank itself: torchrun starts one per rank). An exit hook writes it, so it is there
also when the program ends with os._exit after running the exit hooks, as trainbox may.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import runpy
import sys
from pathlib import Path


def record(out: Path) -> None:
    """This process's peak RSS so far, as rank-RANK.json in `out`."""
    rank = int(os.environ.get("RANK", "0"))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    data = {"rank": rank, "peak_rss_mib": peak_kib / 1024}
    (out / f"rank-{rank}.json").write_text(json.dumps(data))


def main() -> None:
    out, rest = Path(sys.argv[1]), sys.argv[2:]
    atexit.register(record, out)
    become(rest)


def become(rest: list[str]) -> None:
    """Run `rest` (`-m MODULE ARGS` or `SCRIPT ARGS`) as this process's main program."""
    if rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        sys.path.insert(0, str(Path(rest[0]).resolve().parent))
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
