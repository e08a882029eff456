"""Eight real ranks, a reduced CI case of the scale work (docs/scale.md; tests/dist/
test_hang_blame.py kills a rank among 12).

Node mode starts 8 workers on this 2-CPU machine (`trainbox run dist.procs_per_node=8`: its
supervisor runs torchrun and reports the workers' exit code, where torchrun alone says 1). A
SIGUSR1 on one rank stops all eight after one agreed step with a checkpoint and exit 143;
running the same command again ends with the params_sha256 of an uninterrupted 8-rank run of
the same config, made beside it on the same machine: which bits are right depends on the
processor (tests/dist/test_pinned_fingerprints.py), and what this test proves is that the stop
and the resume change none of them.

It is also the suite's resume from 3 ranks on, where gloo's summation order follows DDP's
bucket layout, which DDP rebuilds after a process's first backward: a resumed run that skipped
the settling backward (train/parallel/ddp.py) would round differently from the uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_pinned_fingerprints import PORTABLE

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow

# Four ranks a CPU: enough to show the stop and the resume hold when ranks far outnumber
# the CPUs (12 cost each of the three runs half as much again).
RANKS = 8
CONFIG = [*QUICK, "train.max_steps=30", "train.eval_every=0", "train.ckpt_every=10",
          f"dist.procs_per_node={RANKS}"]  # fmt: skip


def test_a_signal_stops_eight_ranks_together_and_the_rerun_is_bit_exact(tmp_path: Path) -> None:
    train(tmp_path / "uninterrupted", *CONFIG, env=PORTABLE)
    uninterrupted = summary(tmp_path / "uninterrupted")["params_sha256"]
    run_dir = tmp_path / "stopped"
    fault = {**PORTABLE, "TRAINBOX_FAULT": "signal:rank=7:step=15:sig=USR1"}
    stopped = train(run_dir, *CONFIG, env=fault, check=False)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert (record["kind"], record["reason"]) == ("stop", "SIGUSR1")
    stop = record["step"]
    assert 15 <= stop < 30
    assert (run_dir / "checkpoints" / f"step-{stop:08d}.pt").is_file()
    assert stopped.stderr.count(f"trainbox: stopped after step {stop} (SIGUSR1)") == RANKS
    train(run_dir, *CONFIG, env=PORTABLE)
    assert summary(run_dir)["params_sha256"] == uninterrupted
