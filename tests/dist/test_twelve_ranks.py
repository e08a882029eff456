"""Twelve real ranks, the reduced CI case of the scale work (docs/scale.md).

Node mode starts 12 workers on this 2-CPU machine (`trainbox run dist.procs_per_node=12`: its
supervisor runs torchrun and reports the workers' exit code, where torchrun alone says 1). A SIGUSR1 on one rank stops all twelve after
one agreed step with a checkpoint and exit 143; running the same command again ends with the
params_sha256 of an uninterrupted 12-rank run, pinned here (measured with the portable CPU code
paths of tests/dist/test_pinned_fingerprints.py, so it holds on any x86-64 machine with AVX2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_pinned_fingerprints import PORTABLE

from runs import QUICK, summary, train

pytestmark = pytest.mark.slow

RANKS = 12
CONFIG = [*QUICK, "train.max_steps=30", "train.eval_every=0", "train.ckpt_every=10",
          f"dist.procs_per_node={RANKS}"]  # fmt: skip
# params_sha256 of the uninterrupted run: `train(run_dir, *CONFIG, env=PORTABLE)`.
UNINTERRUPTED = "39952fbc023d691ebf7026027c814b232ec6c8297c104f7269a7431fa2887793"


def test_a_signal_stops_twelve_ranks_together_and_the_rerun_is_bit_exact(tmp_path: Path) -> None:
    fault = {**PORTABLE, "TRAINBOX_FAULT": "signal:rank=7:step=15:sig=USR1"}
    stopped = train(tmp_path, *CONFIG, env=fault, check=False)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert (record["kind"], record["reason"]) == ("stop", "SIGUSR1")
    stop = record["step"]
    assert 15 <= stop < 30
    assert (tmp_path / "checkpoints" / f"step-{stop:08d}.pt").is_file()
    assert stopped.stderr.count(f"trainbox: stopped after step {stop} (SIGUSR1)") == RANKS
    train(tmp_path, *CONFIG, env=PORTABLE)
    assert summary(tmp_path)["params_sha256"] == UNINTERRUPTED
