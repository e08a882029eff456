"""The shipped sbatch scripts on the local Slurm cluster, the image run under Apptainer's rules by
the stand-in tests/container/bin/apptainer: read-only, as a uid that neither the image nor the
host knows, with the user's HOME, /tmp and working directory bound, the host's environment and
network, and train.def's runscript (see the stand-in's header and tests/container/standin.py).

Each script runs once (a few minutes each on two CPUs); its tests read that one job. The
preemption test runs train-per-gpu.sbatch once more, stopped by USR1 and requeued.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from container import standin
from container.image import ROOT
from launchers.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

QUICK = ["train.max_steps=40", "train.eval_every=20", "train.ckpt_every=20", "dist.timeout_s=120"]

# script, sbatch options fitting the 2-CPU, GPU-less local nodes (they override the #SBATCH
# lines), extra trainbox overrides, expected world size, expected `apptainer run` calls, and the
# uid the job runs as (one per job, so that what each job wrote can be told apart).
SCRIPTS = [
    ("train-per-gpu.sbatch", ["--ntasks-per-node=2", "--cpus-per-task=1"], [], 4, 4, 4242),
    (
        "train-per-node.sbatch",
        ["--ntasks-per-node=1", "--cpus-per-task=2"],
        ["dist.procs_per_node=2"],
        4,
        2,
        4243,
    ),
    ("train-mpirun.sbatch", ["--ntasks-per-node=2", "--cpus-per-task=1"], [], 4, 4, 4244),
]


@dataclass(frozen=True)
class Job:
    user: standin.User
    name: str
    world: int
    calls: int
    state: str
    text: str  # the job's output file
    diagnostics: str
    recorded: list[str]  # the stand-in's calls
    written: list[str]  # what the user owns outside run_dir and the home cache afterwards

    @property
    def run_dir(self) -> Path:
        return self.user.runs / self.name

    @property
    def cache(self) -> Path:
        return self.user.home / ".cache" / "trainbox" / "torchinductor"


def submit_env(user: standin.User, image: str) -> dict[str, str]:
    return {
        **user.env(),
        "TRAINBOX_SIF": image,
        "TRAINBOX_RUNS": str(user.runs),
        "TRAINBOX_SLURM_DIR": str(ROOT / "slurm"),
        "TRAINBOX_APPTAINER_LOG": str(user.root / "apptainer-calls"),
        # CI submits as root; Open MPI refuses that unless told (users' jobs are not root).
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }


def submit_args(user: standin.User, name: str) -> list[str]:
    """Fitting the 2-CPU, GPU-less local nodes; run from the user's own working directory."""
    return ["--nodes=2", "--gpus-per-node=0", "--time=00:15:00", f"--job-name={name}",
            f"--output={user.root / 'job.out'}", f"--chdir={user.work}"]  # fmt: skip


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module", params=SCRIPTS, ids=[script for script, *_ in SCRIPTS])
def job(
    request: pytest.FixtureRequest, slurm_cluster: SlurmCluster, built_image: str
) -> Iterator[Job]:
    script, options, overrides, world, calls, uid = request.param
    name = "tb"
    with standin.user(uid) as user:
        job_id = slurm_cluster.sbatch(
            ROOT / "slurm" / script,
            args=[*submit_args(user, name), *options],
            env=submit_env(user, built_image),
            script_args=[*QUICK, *overrides],
        )
        state = slurm_cluster.wait_job(job_id, timeout=600)
        cache = user.home / ".cache" / "trainbox" / "torchinductor"
        yield Job(
            user, name, world, calls, state,
            text=read(user.root / "job.out"),
            diagnostics=slurm_cluster.diagnostics(job_id),
            recorded=read(user.root / "apptainer-calls").splitlines(),
            written=user.written(allowed=[user.runs / name, cache]),
        )  # fmt: skip


def test_sbatch_script_trains_in_the_image(job: Job, built_image: str) -> None:
    assert job.state == "COMPLETED", job.text[-3000:] + job.diagnostics
    assert "trained 40 steps: " in job.text
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["steps"]) == (job.world, 40)
    assert len(job.recorded) == job.calls
    runs = job.user.runs
    assert all(
        line.startswith(
            f"restart=0 run --nv --bind {runs}:/runs {built_image} run run_dir=/runs/tb"
        )
        for line in job.recorded
    ), job.recorded


def test_sbatch_job_writes_only_its_run_dir_and_the_compile_cache_it_logs(job: Job) -> None:
    assert job.state == "COMPLETED", job.text[-3000:] + job.diagnostics
    assert job.written == []
    logged = {
        (event["path"], event["source"])
        for line in job.text.splitlines()
        if line.startswith("{") and (event := json.loads(line)).get("event") == "compile cache"
    }
    assert logged == {(str(job.cache), "HOME")}, job.text[-3000:]


# Preemption: wide layers so that a step takes milliseconds and USR1 lands mid-run; one task per
# node (world size 2), which starts fastest on the 2-CPU nodes.
PREEMPT_STEPS = 200
PREEMPT_CKPT_EVERY = 7
PREEMPT = [f"train.max_steps={PREEMPT_STEPS}", "train.log_every=5", "train.eval_every=0",
           f"train.ckpt_every={PREEMPT_CKPT_EVERY}", "train.keep_last=3",
           "model.args.hidden=512", "dist.timeout_s=60"]  # fmt: skip
TIMEOUT_S = 300


def stopped_steps(text: str) -> list[int]:
    """The step of each `trainbox: stopped after step N (SIGUSR1)...` line (one per task)."""
    return [int(n) for n in re.findall(r"^trainbox: stopped after step (\d+) \(SIGUSR1\)", text, re.M)]  # fmt: skip


def test_sbatch_job_preempted_with_usr1_requeues_and_resumes_in_the_image(
    slurm_cluster: SlurmCluster, built_image: str
) -> None:
    name = "preempt"
    with standin.user(4245) as user:
        output = user.root / "job.out"
        job = slurm_cluster.sbatch(
            ROOT / "slurm" / "train-per-gpu.sbatch",
            args=[*submit_args(user, name), "--ntasks-per-node=1", "--cpus-per-task=2"],
            env=submit_env(user, built_image),
            script_args=PREEMPT,
        )
        # No process of ours to read from: the output file shows rank 0's first checkpoint.
        slurm_cluster.wait_for_output(job, output, '"event": "checkpoint"', timeout=TIMEOUT_S)
        slurm_cluster.preempt_batch(job, timeout=TIMEOUT_S)
        state = slurm_cluster.wait_job(job, timeout=TIMEOUT_S)
        text = read(output)
        assert state == "COMPLETED", text[-3000:] + slurm_cluster.diagnostics(job)
        final = slurm_cluster.job_info(job)
        assert (final["Restarts"], final["ExitCode"]) == ("1", "0:0"), final

        assert "trainbox: preemption signal, forwarding USR1 to the step" in text, text[-3000:]
        stops = stopped_steps(text)
        step = stops[0] if stops else -1
        assert stops == [step, step], text[-3000:]
        assert PREEMPT_CKPT_EVERY < step < PREEMPT_STEPS, f"stopped at {step}: not mid-run"
        requeued = f"trainbox: step stopped after a checkpoint (exit 143); requeueing job {job}"
        trained = [line for line in text.splitlines() if line.startswith("trained ")]
        assert [line.split(":")[0] for line in trained] == [f"trained {PREEMPT_STEPS} steps"]
        stopped = f"trainbox: stopped after step {step} (SIGUSR1)"
        assert text.index(stopped) < text.index(requeued) < text.index(trained[0])
        # Two tasks a run, one per node; the second run saw SLURM_RESTART_COUNT=1.
        recorded = read(user.root / "apptainer-calls").splitlines()
        assert Counter(line.split(" ", 1)[0] for line in recorded) == {
            "restart=0": 2, "restart=1": 2
        }  # fmt: skip
        run_dir = user.runs / name
        run = json.loads((run_dir / "run.json").read_text())
        assert run["resumed_from"] == f"/runs/{name}/checkpoints/step-{step:08d}.pt"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["steps"], summary["world_size"]) == (PREEMPT_STEPS, 2)
