"""The shipped sbatch scripts on the local Slurm cluster, the image run by an `apptainer`
stand-in (tests/container/bin/apptainer: `apptainer run` -> `podman run --env-host`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from container.image import ROOT
from launchers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

STAND_IN = Path(__file__).parent / "bin"
QUICK = ["train.max_steps=40", "train.eval_every=20", "train.ckpt_every=20", "dist.timeout_s=120"]

# script, sbatch options fitting the 2-CPU, GPU-less local nodes (they override the #SBATCH
# lines), extra trainbox overrides, expected world size, expected `apptainer run` calls.
SCRIPTS = [
    ("train-per-gpu.sbatch", ["--ntasks-per-node=2", "--cpus-per-task=1"], [], 4, 4),
    (
        "train-per-node.sbatch",
        ["--ntasks-per-node=1", "--cpus-per-task=2"],
        ["dist.procs_per_node=2"],
        4,
        2,
    ),
    ("train-mpirun.sbatch", ["--ntasks-per-node=2", "--cpus-per-task=1"], [], 4, 4),
]


@pytest.mark.parametrize(("script", "options", "overrides", "world", "calls"), SCRIPTS)
def test_sbatch_script_trains_in_the_image(
    slurm_cluster: SlurmCluster, built_image: str, tmp_path: Path,
    script: str, options: list[str], overrides: list[str], world: int, calls: int,
) -> None:  # fmt: skip
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o777)  # the image runs as uid 1000
    log = tmp_path / "apptainer-calls"
    output = tmp_path / "job.out"
    env = {
        "PATH": f"{STAND_IN}:{os.environ['PATH']}",
        "TRAINBOX_SIF": built_image,
        "TRAINBOX_RUNS": str(runs),
        "TRAINBOX_SLURM_DIR": str(ROOT / "slurm"),
        "TRAINBOX_APPTAINER_LOG": str(log),
        # CI submits as root; Open MPI refuses that unless told (users' jobs are not root).
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    args = [
        "--nodes=2",
        "--gpus-per-node=0",
        "--time=00:15:00",
        f"--output={output}",
        "--job-name=tb",
        *options,
    ]
    job = slurm_cluster.sbatch(
        ROOT / "slurm" / script, args=args, env=env, script_args=[*QUICK, *overrides]
    )
    state = slurm_cluster.wait_job(job, timeout=600)
    text = output.read_text() if output.exists() else ""
    assert state == "COMPLETED", text[-3000:] + slurm_cluster.diagnostics(job)
    assert "trained 40 steps: " in text
    summary = json.loads((runs / "tb" / "summary.json").read_text())
    assert (summary["world_size"], summary["steps"]) == (world, 40)
    recorded = log.read_text().splitlines()
    assert len(recorded) == calls
    assert all(
        line.startswith(f"run --nv --bind {runs}:/runs {built_image} run run_dir=/runs/tb")
        for line in recorded
    )


@pytest.mark.parametrize("script", [name for name, *_ in SCRIPTS])
def test_header_gives_the_sbatch_command_and_preemption_settings(script: str) -> None:
    text = (ROOT / "slurm" / script).read_text()
    assert f"sbatch slurm/{script}" in text
    for directive in (
        "--requeue",
        "--signal=B:USR1@",
        "--open-mode=append",
        "--gpus-per-node=",
        "--cpus-per-task=",
    ):
        assert f"#SBATCH {directive}" in text
    assert "--kill-on-bad-exit=1" in text or "SLURM_KILL_BAD_EXIT=1" in text
    assert "trainbox_step" in text
