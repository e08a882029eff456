"""The next attempt without the bad node, on the real local Slurm cluster.

slurm/train-per-node.sbatch runs a one-node job (node mode, 2 workers). On node n1 something
goes wrong: a fake NVML makes GPU 1 fall off the bus (XID 79) mid-run, or rank 1 is killed, or
preflight fails at start. trainbox records n1 in run_dir/bad_nodes/ and exits 3 or 4, and the
batch shell requeues the job with n1 excluded. It runs again on n2, resumes and ends with the
parameters of an uninterrupted run at the same world size. Where the job cannot come back (its
node retries used up, or too few nodes left in the partition), the batch shell says why and the
job ends with trainbox's exit code.

NVML is simulated at the narrowest boundary, the pynvml module (tests/fakenvml_shim), on n1
only: a wrapper around python puts the shim on PYTHONPATH when SLURMD_NODENAME is n1. trainbox
runs from this venv through tests/launchers/bin/apptainer, a stand-in for `apptainer run`: the
image adds nothing to the requeue under test (tests/container runs the scripts in the image).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainbox.process import bad_nodes

from launchers.slurm_cluster import ACTIVE_JOB_STATES, SlurmCluster
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
          "train.ckpt_every=100", "model.args.hidden=512", "dist.procs_per_node=2",
          "health.sample_every_s=0.05", "dist.timeout_s=30"]  # fmt: skip
# Generous for a job, its requeue and its second run on a loaded 2-core box.
TIMEOUT_S = 240


@dataclass(frozen=True, kw_only=True)
class NodeFault:
    """What goes wrong on node n1, and what trainbox records of it."""

    # The shell exports for trainbox's python on n1.
    exports: str = ""
    # Overrides appended to trainbox's command line on n1.
    overrides: str = ""
    # The record's reason, exit code and writing rank.
    reason: str
    exit_code: int
    rank: int
    # Words the record's detail contains.
    detail: str
    # Whether the job's first run left a checkpoint for the second to resume from.
    resumes: bool


FAULTS = {
    # A GPU falls off the bus mid-run: the faulty rank records it; every rank checkpoints.
    "gpu-fault": NodeFault(
        exports=f'PYTHONPATH="{SHIM}${{PYTHONPATH:+:$PYTHONPATH}}" TRAINBOX_FAKE_NVML=xid79_in_training',
        reason=bad_nodes.GPU_FAULT, exit_code=3, rank=1, detail="XID 79", resumes=True,
    ),
    # A rank dies without a word after step 150: rank 0 survives to record its node.
    "rank-died": NodeFault(
        exports="TRAINBOX_FAULT=kill:rank=1:step=150",
        reason=bad_nodes.RANKS_DIED, exit_code=4, rank=0, detail="rank 1 (n1)", resumes=True,
    ),
    # No GPU on n1 while the job requires one: preflight fails before any step.
    "preflight": NodeFault(
        overrides="preflight.gpus=require",
        reason=bad_nodes.PREFLIGHT, exit_code=3, rank=0, detail="driver", resumes=False,
    ),
}  # fmt: skip


def faulty_python(tmp_path: Path, fault: NodeFault) -> Path:
    """A python that, on node FAULTY only, runs trainbox with `fault`."""
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/bash\n"
        f"if [[ ${{SLURMD_NODENAME:-}} == {FAULTY} ]]; then\n"
        f"  {'export ' + fault.exports if fault.exports else ':'}\n"
        f'  exec "{PYTHON}" "$@" {fault.overrides}\n'
        "fi\n"
        f'exec "{PYTHON}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def submit(
    cluster: SlurmCluster, tmp_path: Path, fault: NodeFault, *, nodes: int = 1, retries: int = 2
) -> tuple[int, Path, Path]:
    """Submit train-per-node.sbatch with `fault` on n1: the job id, its output file, its run_dir."""
    runs, output, name = tmp_path / "runs", tmp_path / "job.out", f"bad-{uuid.uuid4().hex[:8]}"
    runs.mkdir()
    env = {
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{STAND_IN}:{cluster.env['PATH']}",
        "TRAINBOX_PYTHON": str(faulty_python(tmp_path, fault)),
        "TRAINBOX_SIF": "unused.sif",
        "TRAINBOX_RUNS": str(runs),
        "TRAINBOX_SLURM_DIR": str(ROOT / "slurm"),
        "TRAINBOX_NODE_RETRIES": str(retries),
    }
    args = [f"--nodes={nodes}", "--ntasks-per-node=1", "--cpus-per-task=2", "--gpus-per-node=0",
            "--time=00:10:00", f"--output={output}", f"--job-name={name}"]  # fmt: skip
    job = cluster.sbatch(
        ROOT / "slurm" / "train-per-node.sbatch", args=args, env=env, script_args=CONFIG
    )
    return job, output, runs / name


def skip_the_requeue_wait(cluster: SlurmCluster, job: int) -> None:
    """Wait for the job's end; once the batch shell has requeued it (held, excluded, released),
    let it start again soon.

    Slurm makes a requeued job wait a credential lifetime (120 s) before it may start again; as
    in SlurmCluster.preempt_batch, the test moves its start to 2 s from now. Slurm sets the wait
    again when the old run's last step is cleaned up, which may come after the move: so the move
    is repeated for as long as the job waits with its start far off.
    """
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        info = cluster.job_info(job)
        if info.get("JobState", "UNKNOWN") not in ACTIVE_JOB_STATES | {"UNKNOWN"}:
            return
        if released(info) and starts_in(info) > 5:
            moved = cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now+2"])
            assert moved.returncode == 0, moved.stdout + moved.stderr
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not end\n{cluster.diagnostics(job)}")


def released(info: dict[str, str]) -> bool:
    """Requeued once, released, and waiting out the requeue delay: the batch shell's hold, update
    and release are done."""
    waiting = (info.get("JobState"), info.get("Reason")) == ("PENDING", "BeginTime")
    return info.get("Restarts") == "1" and waiting


def starts_in(info: dict[str, str]) -> float:
    """Seconds until the job's StartTime (Slurm's local time, as `scontrol show job` prints it)."""
    try:
        start = datetime.datetime.strptime(info.get("StartTime", ""), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return 0.0
    return (start - datetime.datetime.now()).total_seconds()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run at the same world size, uninterrupted (node mode on this host)."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(run_dir, *CONFIG)
    return run_dir


@pytest.mark.parametrize("case", FAULTS)
def test_a_bad_node_requeues_the_job_without_it_and_it_finishes_elsewhere(
    slurm_cluster: SlurmCluster, reference: Path, tmp_path: Path, case: str
) -> None:
    fault = FAULTS[case]
    job, output, run_dir = submit(slurm_cluster, tmp_path, fault)
    skip_the_requeue_wait(slurm_cluster, job)
    state = slurm_cluster.wait_job(job)
    text = output.read_text(errors="replace") if output.exists() else ""
    assert state == "COMPLETED", f"{text[-6000:]}\n{slurm_cluster.diagnostics(job)}"
    info = slurm_cluster.job_info(job)
    assert (info["Restarts"], info["ExcNodeList"], info["NodeList"]) == ("1", FAULTY, "n2"), info

    # One rank alone recorded the node, for the job's first attempt.
    records = bad_nodes.read(run_dir)
    assert [
        (r.host, r.reason, r.exit_code, r.rank, r.job_id, r.restart_count) for r in records
    ] == [(FAULTY, fault.reason, fault.exit_code, fault.rank, str(job), None)]
    assert fault.detail in records[0].detail
    requeued = (
        f"trainbox: exit {fault.exit_code} on bad node(s) {FAULTY} (run_dir/bad_nodes);"
        f" requeueing job {job} without {FAULTY} (node retry 1 of 2)"
    )
    assert requeued in text, text[-6000:]

    # The second run resumed from the first's newest checkpoint, where it left one.
    resumed = json.loads((run_dir / "run.json").read_text())["resumed_from"]
    assert (resumed is not None) == fault.resumes, resumed
    assert resumed is None or "/checkpoints/step-" in resumed, resumed
    got, want = summary(run_dir), summary(reference)
    assert (got["steps"], got["world_size"]) == (300, 2)
    assert got["params_sha256"] == want["params_sha256"]


@pytest.mark.parametrize(
    ("nodes", "retries", "why"),
    [
        # Both nodes of the two-node partition are needed: without n1 one is left.
        (2, 2, f"{FAULTY} failed it; without {FAULTY} the partition has 1 usable node(s) and the"
               " job needs 2"),
        (1, 0, f"{FAULTY} failed it, and the job came back without a bad node 0 time(s) already"
               " (TRAINBOX_NODE_RETRIES=0)"),
    ],
    ids=["partition-too-small", "no-retries-left"],
)  # fmt: skip
def test_a_job_that_cannot_come_back_without_its_bad_node_ends_saying_why(
    slurm_cluster: SlurmCluster, tmp_path: Path, nodes: int, retries: int, why: str
) -> None:
    job, output, run_dir = submit(
        slurm_cluster, tmp_path, FAULTS["preflight"], nodes=nodes, retries=retries
    )
    state = slurm_cluster.wait_job(job, timeout=TIMEOUT_S)
    text = output.read_text(errors="replace") if output.exists() else ""
    info = slurm_cluster.job_info(job)
    assert (state, info["Restarts"], info["ExitCode"]) == ("FAILED", "0", "3:0"), text[-6000:]
    assert f"trainbox: not requeueing job {job} after exit 3: {why}" in text, text[-6000:]
    assert [r.host for r in bad_nodes.read(run_dir)] == [FAULTY]
