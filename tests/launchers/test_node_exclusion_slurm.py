"""The next attempt without the bad node, on the real local Slurm cluster.

slurm/train-per-node.sbatch runs a one-node job (node mode, 2 workers); a fake NVML makes GPU 1
of node n1 fall off the bus (XID 79) mid-run. trainbox stops every rank with a checkpoint and
exit 3, the faulty rank records n1 in run_dir/bad_nodes/, and the batch shell requeues the job
with n1 excluded. It runs again on n2, resumes and ends with the parameters of an uninterrupted
run at the same world size.

NVML is simulated at the narrowest boundary, the pynvml module (tests/fakenvml_shim), on n1
only: a wrapper around python puts the shim on PYTHONPATH when SLURMD_NODENAME is n1. trainbox
runs from this venv through tests/launchers/bin/apptainer, a stand-in for `apptainer run`: the
image adds nothing to the requeue under test (tests/container runs the scripts in the image).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from trainbox.process import bad_nodes

from launchers.slurm_cluster import SlurmCluster
from runs import summary, train

pytestmark = pytest.mark.slow

PYTHON = sys.executable
ROOT = Path(__file__).parents[2]
STAND_IN = Path(__file__).parent / "bin"
SHIM = Path(__file__).parents[1] / "fakenvml_shim"
# The job's first node: an idle cluster gives a one-node job its first node.
FAULTY = "n1"
# Wide enough that a step takes milliseconds, long enough that the fault (the 3rd NVML sample,
# 50 ms apart) lands mid-run; a fixed max_steps, so the schedule does not depend on the stop.
CONFIG = ["train.max_steps=300", "train.log_every=10", "train.eval_every=0",
          "train.ckpt_every=0", "model.args.hidden=512", "dist.procs_per_node=2",
          "health.sample_every_s=0.05", "dist.timeout_s=30"]  # fmt: skip
# Generous for a job, its requeue and its second run on a loaded 2-core box.
TIMEOUT_S = 240


def faulty_python(tmp_path: Path) -> Path:
    """A python that gives node FAULTY the fake NVML whose GPU 1 falls off the bus."""
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/bash\n"
        f"if [[ ${{SLURMD_NODENAME:-}} == {FAULTY} ]]; then\n"
        f'  export PYTHONPATH="{SHIM}${{PYTHONPATH:+:$PYTHONPATH}}"'
        " TRAINBOX_FAKE_NVML=xid79_in_training\n"
        "fi\n"
        f'exec "{PYTHON}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def skip_the_requeue_wait(cluster: SlurmCluster, job: int) -> None:
    """Once the batch shell has requeued its job (held, excluded, released), let it start at once.

    Slurm makes a requeued job wait a credential lifetime (120 s) before it may start again;
    as in SlurmCluster.preempt_batch, the test moves its start to 2 s from now.
    """
    info = cluster.wait_until(
        job,
        lambda i: released(i) or i.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING"),
        what="requeue without the bad node (Restarts=1, released), or the job's end",
        timeout=TIMEOUT_S,
    )
    if released(info) and info["JobState"] == "PENDING":
        moved = cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now+2"])
        assert moved.returncode == 0, moved.stdout + moved.stderr


def released(info: dict[str, str]) -> bool:
    """Requeued once, released, and waiting out the requeue delay: the batch shell's hold, update
    and release are done, and so is the old run (until then Slurm may set the delay again)."""
    waiting = (info.get("JobState"), info.get("Reason")) == ("PENDING", "BeginTime")
    return info.get("Restarts") == "1" and waiting


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run at the same world size, uninterrupted (node mode on this host)."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(run_dir, *CONFIG)
    return run_dir


def test_a_gpu_fault_requeues_the_job_without_its_node_and_it_finishes_elsewhere(
    slurm_cluster: SlurmCluster, reference: Path, tmp_path: Path
) -> None:
    runs, output, name = tmp_path / "runs", tmp_path / "job.out", f"bad-{uuid.uuid4().hex[:8]}"
    runs.mkdir()
    env = {
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{STAND_IN}:{slurm_cluster.env['PATH']}",
        "TRAINBOX_PYTHON": str(faulty_python(tmp_path)),
        "TRAINBOX_SIF": "unused.sif",
        "TRAINBOX_RUNS": str(runs),
        "TRAINBOX_SLURM_DIR": str(ROOT / "slurm"),
    }
    args = ["--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2", "--gpus-per-node=0",
            "--time=00:10:00", f"--output={output}", f"--job-name={name}"]  # fmt: skip
    job = slurm_cluster.sbatch(
        ROOT / "slurm" / "train-per-node.sbatch", args=args, env=env, script_args=CONFIG
    )
    skip_the_requeue_wait(slurm_cluster, job)
    state = slurm_cluster.wait_job(job, timeout=TIMEOUT_S)
    text = output.read_text(errors="replace") if output.exists() else ""
    assert state == "COMPLETED", f"{text[-6000:]}\n{slurm_cluster.diagnostics(job)}"
    info = slurm_cluster.job_info(job)
    assert (info["Restarts"], info["ExcNodeList"], info["NodeList"]) == ("1", FAULTY, "n2"), info

    # The faulty rank alone recorded its node, for the job's first attempt.
    run_dir = runs / name
    records = bad_nodes.read(run_dir)
    assert [
        (r.host, r.reason, r.exit_code, r.rank, r.job_id, r.restart_count) for r in records
    ] == [(FAULTY, bad_nodes.GPU_FAULT, 3, 1, str(job), None)]
    assert "XID 79" in records[0].detail
    requeued = (
        f"trainbox: exit 3 on bad node(s) {FAULTY} (run_dir/bad_nodes); requeueing job {job}"
        f" without {FAULTY} (node retry 1 of 2)"
    )
    assert requeued in text, text[-6000:]

    # The second run resumed from the checkpoint the fault's agreed stop wrote.
    resumed = json.loads((run_dir / "run.json").read_text())["resumed_from"]
    assert resumed is not None
    assert "/checkpoints/step-" in resumed, resumed
    got, want = summary(run_dir), summary(reference)
    assert (got["steps"], got["world_size"]) == (300, 2)
    assert got["params_sha256"] == want["params_sha256"]
