"""`torchrun --virtual-local-rank`: every worker has LOCAL_RANK=0, yet each gets its own CPUs.

Real run: torchrun starts two `trainbox exec` workers on this machine; each pins itself and then
runs a tiny script that records its LOCAL_RANK and the CPUs it may run on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiers
from runs import clean_env

pytestmark = pytest.mark.slow

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
# What the exec'd script sees: its LOCAL_RANK and the CPUs trainbox pinned it to.
RECORD = (
    "import json, os, sys; "
    "open(os.path.join(sys.argv[1], os.environ['RANK'] + '.json'), 'w').write(json.dumps("
    "{'local_rank': os.environ['LOCAL_RANK'], 'cpus': sorted(os.sched_getaffinity(0))}))"
)


def test_virtual_local_rank_workers_are_pinned_to_disjoint_cpus(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        tiers.unavailable("two workers need two CPUs to be pinned apart")
    trainbox = [sys.executable, "-m", "trainbox", "exec", "--", sys.executable, "-c", RECORD]
    argv = [*TORCHRUN, "--virtual-local-rank", "--no-python", *trainbox, str(tmp_path)]
    proc = subprocess.run(
        argv, env=clean_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    # The script keeps torchrun's LOCAL_RANK: its one visible GPU is device 0.
    assert [worker["local_rank"] for worker in seen] == ["0", "0"]
    first, second = (set(worker["cpus"]) for worker in seen)
    assert first, seen
    assert second, seen
    assert not first & second, seen
