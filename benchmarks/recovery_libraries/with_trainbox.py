"""trainbox's dist.recovery=in_process, measured the way with_torchft.py and with_nvrx.py
measure the libraries: one worker of 4 SIGKILLed mid-run, against the same job uninterrupted.

Run: .venv/bin/python benchmarks/recovery_libraries/with_trainbox.py

The figures come from the run's own `kind: recovery` record in metrics.jsonl (seconds from the
kill, by the dead worker's keeper's clock, to the end of the next step on rank 0; steps trained
again) and from summary.json's params_sha256.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = [
    "dist.procs_per_node=4", "dist.recovery=in_process", "dist.timeout_s=8",
    "train.max_steps=60", "train.log_every=5", "model.args.hidden=512",
]  # fmt: skip


def run(run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> float:
    argv = [sys.executable, "-m", "trainbox", "run", f"run_dir={run_dir}", *CONFIG, *extra]
    t = time.perf_counter()
    proc = subprocess.run(
        argv,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill", default="kill:rank=1:step=30")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="recovery-ours-"))
    run(root / "ref", "dist.max_recoveries=0")
    env = {"TRAINBOX_FAULT": a.kill, "TRAINBOX_FAULT_ONCE": str(root / "fired")}
    run(root / "killed", env=env)
    lines = (root / "killed" / "metrics.jsonl").read_text().splitlines()
    records = [r for line in lines if (r := json.loads(line))["kind"] == "recovery"]
    sha = {
        name: json.loads((root / name / "summary.json").read_text())["params_sha256"]
        for name in ("ref", "killed")
    }
    print(
        json.dumps(
            {
                "recovery": records,
                "params_sha256": sha,
                "bit_exact": sha["ref"] == sha["killed"],
                "run_dir": str(root),
            }
        )
    )


if __name__ == "__main__":
    main()
