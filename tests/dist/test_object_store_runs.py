"""run_dir=s3://: real runs against a real S3-compatible server (moto's, tests/s3server.py) on
loopback, with no file system shared between the "nodes": each gets its own TMPDIR, where its
working copy lives, and anything one node needs from another must come through the bucket.

- torchrun, killed in the middle of an upload, resumed on two other nodes to the params of an
  uninterrupted run; only rank 0 lists, nothing secret is logged, every reader takes the URL;
- fsdp on the local Slurm cluster's two nodes, each rank writing its own shards to the bucket,
  then evaluated by one process;
- a store that stops answering mid-save, and preflight's verdict on bad stores.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freeport import free_port
from launchers.slurm_cluster import SlurmCluster
from runs import QUICK, clean_env, shared_run, summary, trainbox_argv
from s3server import S3Server

pytestmark = pytest.mark.slow

# test_launch_invariance.py's config, so its two-rank reference run is made once for both.
CONFIG = [*QUICK, "pinning.num_threads=1"]
TIMEOUT_S = 240
BUCKET = "runs"


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    """One server for the module's runs; each test uses a prefix of its own."""
    with S3Server.start() as started:
        started.make_bucket(BUCKET)
        yield started


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchrun --standalone --nproc-per-node 2 into a local run_dir, uninterrupted."""
    return shared_run(tmp_path_factory, *CONFIG, nproc=2)


def store_env(server: S3Server, tmp: Path, **extra: str) -> dict[str, str]:
    """A node's environment: the store's endpoint and keys, and a TMPDIR of its own."""
    tmp.mkdir(parents=True, exist_ok=True)
    return clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp)) | server.env | extra


def events(stderr: str, name: str) -> list[dict[str, Any]]:
    """The JSON log lines of one event, in order."""
    found = []
    for line in stderr.splitlines():
        if line.startswith("{") and (record := json.loads(line)).get("event") == name:
            found.append(record)
    return found


def killed_mid_upload(server: S3Server, url: str, tmp: Path, secret: str) -> str:
    """torchrun at two ranks, rank 0 SIGKILLed once step 21's checkpoint is in the bucket but
    its marker is not; torchrun then stops rank 1. Returns the output."""
    env = store_env(server, tmp, TRAINBOX_FAULT="crash:point=upload:step=21",
                    AWS_SECRET_ACCESS_KEY=secret)  # fmt: skip
    argv = trainbox_argv(2, "run", f"run_dir={url}", *CONFIG)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)  # fmt: skip
    assert proc.returncode != 0, proc.stderr[-4000:]
    return proc.stderr


def resumed_on_two_nodes(server: S3Server, url: str, tmp: Path, secret: str) -> list[str]:
    """Two torchrun agents meeting by c10d rendezvous, each a node with one rank and its own
    TMPDIR, under --debug. Returns each agent's output."""
    endpoint = f"127.0.0.1:{free_port()}"
    agent = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
             f"--rdzv-endpoint={endpoint}", "--rdzv-id=store"]  # fmt: skip
    argv = trainbox_argv(1, "run", "--debug", f"run_dir={url}", *CONFIG)
    torchrun = [argv[0], "-m", "torch.distributed.run", *agent, *argv[1:]]
    agents = [
        subprocess.Popen(torchrun, env=store_env(server, tmp / f"node{n}",
                         AWS_SECRET_ACCESS_KEY=secret),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for n in range(2)
    ]  # fmt: skip
    outputs = [agent.communicate(timeout=TIMEOUT_S)[1] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs[0][-4000:] + outputs[1][-4000:]
    return outputs


def test_a_run_killed_mid_upload_resumes_on_other_nodes_to_the_uninterrupted_params(
    server: S3Server, reference: Path, tmp_path: Path
) -> None:
    url, prefix = f"s3://{BUCKET}/killed", "killed/"
    # boto3 accepts any secret against moto: a random one shows where it would leak.
    secret = secrets.token_hex(20)
    first = killed_mid_upload(server, url, tmp_path / "first", secret)
    stored = server.keys(BUCKET, prefix)
    # The upload was cut between step 21's file and its marker: in the bucket, not complete.
    assert "killed/checkpoints/step-00000021.pt" in stored
    assert "killed/checkpoints/step-00000021.pt.sha256" not in stored
    assert {"killed/config.yaml", "killed/run.json"} <= set(stored)
    outputs = resumed_on_two_nodes(server, url, tmp_path, secret)
    (resumed,) = {record["step"] for out in outputs for record in events(out, "resumed")}
    assert resumed == 14
    stored = server.keys(BUCKET, prefix)
    done = json.loads(server.read(BUCKET, "killed/summary.json"))
    assert done["params_sha256"] == summary(reference)["params_sha256"]
    assert {f"killed/{name}" for name in ("config.yaml", "run.json", "metrics.jsonl")} <= set(
        stored
    )
    for step in (7, 14, 21, 28, 35, 40):
        assert f"killed/checkpoints/step-{step:08d}.pt.sha256" in stored
    # Requests: only rank 0 lists the prefix; the other node fetches the one checkpoint file.
    requests = {
        record["rank"]: record for out in outputs for record in events(out, "object store requests")
    }
    assert requests[0]["ListObjectsV2"] >= 1
    assert "ListObjectsV2" not in requests[1]
    assert requests[1]["total"] <= 4, requests[1]  # a HEAD and a GET for the file and its sidecar
    # The secret reached boto3 and nothing else: no log line (under --debug) and no stored file.
    for text in (first, *outputs):
        assert secret not in text
    for key in stored:
        assert secret.encode() not in server.read(BUCKET, key)


def trainbox(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`trainbox ARGS` in one process, waited for; fails the test on a non-zero exit."""
    proc = subprocess.run(trainbox_argv(1, *args), env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)  # fmt: skip
    assert proc.returncode == 0, f"{args[:2]}: {proc.stderr[-3000:]}"
    return proc


def test_every_reader_takes_the_runs_url(server: S3Server, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/readers"
    run = trainbox(store_env(server, tmp_path / "trained"), "run", f"run_dir={url}", *QUICK)
    assert f"-> {url}/summary.json" in run.stdout
    assert f"trainbox eval --checkpoint {url}" in run.stdout
    server.client().put_object(Bucket=BUCKET, Key="readers/hang/rank-00000.txt",
                               Body=b"rank: 0\nop: all_reduce\n")  # fmt: skip
    # Another node: nothing of the run in its TMPDIR.
    env = store_env(server, tmp_path / "reader")
    trainbox(env, "eval", "--checkpoint", url)
    trainbox(env, "predict", "--checkpoint", f"{url}/checkpoints/step-00000035.pt",
             "--output", str(tmp_path / "p.csv"))  # fmt: skip
    trainbox(env, "report", url, "--output", str(tmp_path / "report.png"))
    trainbox(env, "hang", url)
    assert (tmp_path / "p.csv").stat().st_size > 0
    assert (tmp_path / "report.png").stat().st_size > 0
    started = trainbox(env, "run", f"run_dir={tmp_path / 'from-url'}", *QUICK,
                       f"train.init_from={url}/checkpoints/step-00000014.pt")  # fmt: skip
    (initialised,) = events(started.stderr, "initialised weights")
    assert initialised["checkpoint"].endswith("readers/checkpoints/step-00000014.pt")
    continued = trainbox(env, "run", f"run_dir={tmp_path / 'resumed'}", *QUICK,
                         f"train.resume={url}/checkpoints/step-00000035.pt")  # fmt: skip
    assert [record["step"] for record in events(continued.stderr, "resumed")] == [35]


FSDP = [*QUICK, "train.strategy=fsdp", "train.batch_size=48", "train.grad_accum=2",
        "train.clip_grad_norm=0.5"]  # fmt: skip


def test_fsdp_on_two_slurm_nodes_writes_each_ranks_shards_and_evaluates_on_one_process(
    server: S3Server, slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:  # fmt: skip
    url = f"s3://{BUCKET}/fsdp"
    # Each node's task gets a TMPDIR of its own: the nodes share no working copy.
    node_tmp = f"{tmp_path}/node-$SLURM_NODEID"
    command = (f'mkdir -p "{node_tmp}" && TMPDIR="{node_tmp}" exec {sys.executable} -m trainbox'
               f" run run_dir={url} {' '.join(FSDP)}")  # fmt: skip
    argv = ["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", command]
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **server.env}
    proc = slurm_cluster.run(argv, env=env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stderr[-6000:]}\n{slurm_cluster.diagnostics()}"
    stored = server.keys(BUCKET, "fsdp/checkpoints/step-00000040.dcp/")
    assert {key.rsplit("/", 1)[1] for key in stored} == {
        "__0_0.distcp", "__1_0.distcp", ".metadata", "record.pt", "manifest.json",
    }  # fmt: skip
    reference = shared_run(tmp_path_factory, *FSDP, nproc=2)
    done = json.loads(server.read(BUCKET, "fsdp/summary.json"))
    assert done["params_sha256"] == summary(reference)["params_sha256"]
    # One process on a third node reads what two ranks wrote: the whole model, from the bucket.
    reader = store_env(server, tmp_path / "reader")
    evaluated = trainbox(reader, "eval", "--checkpoint", url)
    assert "evaluated step-00000040.dcp (step 40)" in evaluated.stdout
    trainbox(reader, "export", "--checkpoint", f"{url}/checkpoints/latest",
             "--output", str(tmp_path / "model.pt"))  # fmt: skip
    assert (tmp_path / "model.pt").stat().st_size > 0


def test_a_store_that_stops_answering_mid_run_fails_the_save_and_keeps_what_it_holds(
    tmp_path: Path,
) -> None:
    with S3Server.start() as frozen:
        frozen.make_bucket(BUCKET)
        argv = trainbox_argv(1, "run", f"run_dir=s3://{BUCKET}/frozen", *QUICK,
                             "storage.timeout_s=1")  # fmt: skip
        started = time.monotonic()
        with subprocess.Popen(argv, env=store_env(frozen, tmp_path), stderr=subprocess.PIPE,
                              text=True) as run:  # fmt: skip
            assert run.stderr is not None
            for line in run.stderr:
                if line.startswith("{") and json.loads(line).get("event") == "checkpoint uploaded":
                    frozen.freeze()
                    break
            rest = run.stderr.read()
            code = run.wait(timeout=TIMEOUT_S)
        elapsed = time.monotonic() - started
        frozen.thaw()
        stored = frozen.keys(BUCKET, "frozen/")
    assert code == 2, rest[-4000:]
    (error,) = [line for line in rest.splitlines() if line.startswith("trainbox: error: ")]
    assert f"the store for bucket '{BUCKET}' does not answer" in error
    assert " HINT: " in error
    assert elapsed < 120
    # Step 7's checkpoint was complete before the store froze, and stays so.
    assert {"frozen/checkpoints/step-00000007.pt",
            "frozen/checkpoints/step-00000007.pt.sha256"} <= set(stored)  # fmt: skip


def preflight(
    server_env: dict[str, str], url: str, tmp: Path, *args: str
) -> tuple[int, str, float]:
    """`trainbox run` against a bad store: its exit code, its error line and its seconds."""
    env = clean_env(TMPDIR=str(tmp)) | server_env
    started = time.monotonic()
    proc = subprocess.run(trainbox_argv(1, "run", f"run_dir={url}", *QUICK, *args), env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error: ")]
    return proc.returncode, error, time.monotonic() - started


def test_preflight_names_a_bucket_that_does_not_exist(server: S3Server, tmp_path: Path) -> None:
    code, error, _ = preflight(server.env, "s3://no-such-bucket/run1", tmp_path)
    assert code == 3
    assert "bucket 'no-such-bucket' does not exist" in error
    assert "HINT: create the bucket first" in error
    assert list(tmp_path.iterdir()) == []


def test_preflight_names_denied_access(tmp_path: Path) -> None:
    with S3Server.start(check_keys=True) as strict:
        code, error, _ = preflight(strict.env, f"s3://{BUCKET}/run1", tmp_path)
    assert code == 3
    assert f"access to bucket '{BUCKET}' denied (InvalidAccessKeyId)" in error
    assert "HINT: check the store's credentials" in error
    assert list(tmp_path.iterdir()) == []


def test_preflight_names_an_endpoint_that_does_not_answer(tmp_path: Path) -> None:
    # storage.timeout_s=2 bounds the probe at 2 tries of 2 s; by default it is 2 of 10 s, under a
    # minute (tests/unit/test_storage_rules.py), and 33 s were measured here.
    with S3Server.start() as stopped:
        stopped.make_bucket(BUCKET)
        stopped.freeze()
        code, error, seconds = preflight(stopped.env, f"s3://{BUCKET}/run1", tmp_path,
                                         "storage.timeout_s=2")  # fmt: skip
        stopped.thaw()
    assert code == 3
    assert f"the store for bucket '{BUCKET}' does not answer (ReadTimeoutError)" in error
    assert "HINT: check AWS_ENDPOINT_URL" in error
    assert seconds < 20
    assert list(tmp_path.iterdir()) == []
