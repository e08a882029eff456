"""Run `trainbox run` for real (one process, or under torchrun) and read what it wrote."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

# Launcher variables of whatever runs the tests must not leak into the runs they start.
_LEAKY = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "TORCHELASTIC_", "PET_", "TRAINBOX_")
_LEAKY_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}  # fmt: skip
# Small and quick: a few dozen steps of the built-in task, checkpoints at odd steps.
QUICK = ["train.max_steps=40", "train.log_every=5", "train.eval_every=20", "train.ckpt_every=7",
         "train.keep_last=20"]  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without launcher variables, one thread per process."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_LEAKY) and key not in _LEAKY_NAMES
    }
    return env | {"OMP_NUM_THREADS": "1"} | extra


def trainbox_argv(nproc: int, *args: str) -> list[str]:
    """argv for `trainbox ARGS`, under `torchrun --standalone` with `nproc` workers if nproc > 1."""
    if nproc == 1:
        return [sys.executable, "-m", "trainbox", *args]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*torchrun, f"--nproc-per-node={nproc}", "-m", "trainbox", *args]


def train(
    run_dir: Path,
    *args: str,
    nproc: int = 1,
    check: bool = True,
    pythonpath: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`trainbox run run_dir=RUN_DIR ARGS` with extra `env`, waited for; fails on a non-zero exit."""
    argv = trainbox_argv(nproc, "run", f"run_dir={run_dir}", *args)
    extra = {"PYTHONPATH": str(pythonpath)} if pythonpath else {}
    env_ = clean_env(**extra) | dict(env or {})
    proc = subprocess.run(argv, env=env_, capture_output=True, text=True, timeout=300, check=False)
    if check:
        assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{proc.stderr[-4000:]}"
    return proc


def until_first_checkpoint(proc: subprocess.Popen[str]) -> bool:
    """Read `proc`'s stderr up to the run's first checkpoint line: training is under way, and
    there is something to resume. False when the run ended without one."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("{") and json.loads(line).get("event") == "checkpoint":
            return True
    return False


def killed_after_first_checkpoint(nproc: int, run_dir: Path, *args: str) -> None:
    """`trainbox run` SIGKILLed, all its processes at once, at its first checkpoint line."""
    argv = trainbox_argv(nproc, "run", f"run_dir={run_dir}", *args)
    env = clean_env(PYTHONUNBUFFERED="1")
    with subprocess.Popen(
        argv, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as agent:
        if until_first_checkpoint(agent):
            os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=60)
    assert agent.returncode == -signal.SIGKILL, f"{argv} exited {agent.returncode} unkilled"
    assert not (run_dir / "summary.json").exists(), "the kill came after the end"


def shared_run(factory: pytest.TempPathFactory, *args: str, nproc: int = 1) -> Path:
    """The run_dir of a finished `trainbox run ARGS`, made once per test session: every module
    that asks for the same ARGS and nproc gets this one, on any pytest-xdist worker (the first
    to ask makes it while the others wait). For reference runs only, that no test writes into.
    """
    key = hashlib.sha256(repr((nproc, args)).encode()).hexdigest()[:16]
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, which holds each worker's basetemp
    run_dir = root / f"shared-run-{key}"
    with (root / f"shared-run-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (run_dir / "summary.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)  # a maker that failed part way
            train(run_dir, *args, nproc=nproc)
    return run_dir


def by_hand(
    *args: str,
    world: int = 2,
    ranks: tuple[int, ...] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[tuple[int, str]]:
    """`trainbox ARGS` as ranks 0..world-1 of an env:// job (or only `ranks`): (code, stderr).

    No agent between the ranks, so every rank's own exit code and error line are seen (torchrun
    stops the other workers as soon as one fails, which can cut a line off).
    """
    from freeport import free_port

    port = str(free_port())
    procs = []
    for rank in ranks if ranks is not None else range(world):
        rank_env = clean_env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                             LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=port) | dict(env or {})  # fmt: skip
        argv = trainbox_argv(1, *args)
        procs.append(subprocess.Popen(argv, env=rank_env, stderr=subprocess.PIPE, text=True))
    return [(proc.wait(timeout=120), proc.communicate()[1]) for proc in procs]


def summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary.json."""
    return json.loads((run_dir / "summary.json").read_text())


def run_record(run_dir: Path) -> dict[str, Any]:
    """The run's run.json."""
    return json.loads((run_dir / "run.json").read_text())
