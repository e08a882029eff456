"""A worker killed with SIGKILL at a random moment: torchrun restarts the group, which resumes
from the newest valid checkpoint and ends with the uninterrupted run's parameters.

Real runs under torchrun --max-restarts and in node mode (trainbox supervising torchrun).
"""

from __future__ import annotations

import json
import os
import platform
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.process import bad_nodes

from runs import QUICK, clean_env, shared_run, summary, train

pytestmark = pytest.mark.slow

# The reference's config (test_preemption's and test_ctrl_c's: one run serves all three).
REFERENCE = [*QUICK, "model.args.hidden=512", "train.max_steps=60"]
# A short wait for a dead peer, which changes no bits.
CONFIG = [*REFERENCE, "dist.timeout_s=20"]
# Random per run, and said in every assertion message so a failure can be replayed.
CHOICE = random.SystemRandom()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory, *REFERENCE, nproc=2)


def test_torchrun_restarts_a_killed_worker_and_the_result_is_unchanged(
    reference: Path, tmp_path: Path
) -> None:
    victim, after_lines = CHOICE.randrange(2), CHOICE.randrange(2, 10)
    replay = f"(victim rank {victim}, killed after {after_lines} step lines)"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=2",
    ]
    argv = [*torchrun, "-m", "trainbox", "run", f"run_dir={tmp_path}", *CONFIG, "train.log_every=1"]
    agent = subprocess.Popen(
        argv, env=clean_env(PYTHONUNBUFFERED="1"), stderr=subprocess.PIPE, text=True
    )
    assert agent.stderr is not None
    seen, killed = 0, None
    # Every rank logs each step with its pid; kill the victim's process mid-run, from outside.
    for line in agent.stderr:
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if (
            event.get("event") == "step"
            and event.get("rank") == victim
            and event.get("step", 0) > 7
        ):
            seen += 1
            if seen == after_lines:
                killed = event["step"]
                os.kill(event["pid"], signal.SIGKILL)
                break
    rest = agent.stderr.read()
    assert agent.wait(timeout=240) == 0, f"{replay}\n{rest[-3000:]}"
    assert killed is not None, replay
    assert killed < 60, replay
    assert "exitcode: -9" in rest, replay
    manifest = json.loads((tmp_path / "run.json").read_text())
    assert manifest["resumed_from"] is not None, replay
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"], replay


def test_node_mode_restarts_a_killed_worker_and_the_result_is_unchanged(
    reference: Path, tmp_path: Path
) -> None:
    victim, step = CHOICE.randrange(2), CHOICE.randrange(8, 58)
    replay = f"(TRAINBOX_FAULT=kill:rank={victim}:step={step})"
    fault = {
        "TRAINBOX_FAULT": f"kill:rank={victim}:step={step}",
        "TRAINBOX_FAULT_ONCE": str(tmp_path / "once"),
    }
    proc = train(
        tmp_path / "run",
        *CONFIG,
        "dist.procs_per_node=2",
        "dist.max_restarts=2",
        env=fault,
        check=False,
    )
    assert proc.returncode == 0, f"{replay}\n{proc.stderr[-3000:]}"
    assert (tmp_path / "once.0").exists(), f"the fault never fired {replay}"
    assert '"event": "resumed"' in proc.stderr, replay
    assert summary(tmp_path / "run")["params_sha256"] == summary(reference)["params_sha256"], replay


def test_without_restarts_the_node_reports_exit_4_naming_the_dead_rank(tmp_path: Path) -> None:
    fault = {"TRAINBOX_FAULT": "kill:rank=1:step=10"}
    proc = train(tmp_path, *CONFIG, "dist.procs_per_node=2", env=fault, check=False)
    assert proc.returncode == 4, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error:")]
    assert line.startswith("trainbox: error: rank 0 failed in ")
    assert "rank 1 (" in line
    assert "is gone: its process exited" in line
    assert "HINT: " in line
    assert not (tmp_path / "summary.json").exists()
    # Rank 0, the lowest rank not blamed, alone recorded the dead rank's node, and said so once.
    records = bad_nodes.read(tmp_path)
    assert [(r.host, r.reason, r.exit_code, r.rank) for r in records] == [
        (platform.node(), bad_nodes.RANKS_DIED, 4, 0)
    ]
    assert records[0].detail.startswith("rank 1 (")
    said = [text for text in proc.stderr.splitlines() if '"event": "bad node"' in text]
    assert len(said) == 1, said
