"""Two real processes that disagree on their image revision both stop with exit 4, naming the rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from freeport import free_port
from runs import QUICK, clean_env, trainbox_argv

pytestmark = pytest.mark.slow


def test_a_rank_with_another_image_stops_the_job_with_exit_4(tmp_path: Path) -> None:
    # Launched by hand (the `env` launcher), so each rank can get its own environment.
    port = str(free_port())
    ranks = []
    for rank, revision in ((0, "abc123"), (1, "old999")):
        env = clean_env(
            RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TRAINBOX_IMAGE_REVISION=revision,
        )  # fmt: skip
        argv = trainbox_argv(1, "run", f"run_dir={tmp_path}", *QUICK, "dist.timeout_s=60")
        ranks.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    results = [
        (proc.wait(timeout=120), proc.stderr.read() if proc.stderr else "") for proc in ranks
    ]
    for code, stderr in results:
        assert code == 4, stderr[-2000:]
        (line,) = [line for line in stderr.splitlines() if line.startswith("trainbox: error:")]
        assert "image_revision differs: " in line
        assert "'old999' on rank 1 (" in line
        assert "HINT: run the same image and config on every node" in line
    assert not (tmp_path / "config.yaml").exists(), "nothing may be written before the ranks agree"


def test_a_rank_from_an_image_with_another_lock_stops_the_job_with_exit_4(tmp_path: Path) -> None:
    # A stale image on one node: its venv's provenance names another lock. The second rank runs
    # from a venv of its own (sys.prefix/provenance, as in the image) that reuses this venv's
    # packages through a .pth file; the first rank's venv has no provenance (lock None).
    stale = tmp_path / "stale-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(stale)], check=True)
    site = next((stale / "lib").glob("python3*/site-packages"))
    (site / "reuse.pth").write_text("\n".join(sys.path[1:]) + "\n")
    (stale / "provenance").mkdir()
    lock = {"lock_sha256": "0" * 64, "revision": "old999", "lock": "requirements-cpu.lock"}
    (stale / "provenance" / "provenance.json").write_text(json.dumps(lock))
    port = str(free_port())
    ranks = []
    for rank, python in ((0, sys.executable), (1, str(stale / "bin" / "python"))):
        env = clean_env(
            RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
        )  # fmt: skip
        argv = [python, *trainbox_argv(1, "run", f"run_dir={tmp_path / 'run'}", *QUICK)[1:]]
        ranks.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    results = [(proc.wait(timeout=120), proc.communicate()[1]) for proc in ranks]
    for code, stderr in results:
        assert code == 4, stderr[-2000:]
        (line,) = [line for line in stderr.splitlines() if line.startswith("trainbox: error:")]
        assert "lock_sha256 differs: None on rank 0 (" in line
        assert f"'{'0' * 64}' on rank 1 (" in line
    assert not (tmp_path / "run" / "config.yaml").exists()
