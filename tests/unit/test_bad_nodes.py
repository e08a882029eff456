"""Bad-node records: the node's name, the attempt, the file layout, parsing, and who writes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import structlog

from trainbox.process import bad_nodes
from trainbox.process.bad_nodes import BadNode
from trainbox.runtime import group
from trainbox.runtime.trainer import stop_error
from trainbox.train.loop import StoppedEarly
from trainbox.watchdog import Blame

RECORD = BadNode(
    host="n1",
    reason=bad_nodes.GPU_FAULT,
    detail="GPU 1 (GPU-5a7e) on host n1, rank 1: XID 79 (GPU has fallen off the bus)",
    exit_code=3,
    rank=1,
    job_id="42",
    restart_count=None,
    time=1764280000.5,
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURMD_NODENAME": "n2", "TRAINBOX_NODE_NAME": "k8s-node"}, "n2"),
        ({"TRAINBOX_NODE_NAME": "k8s-node"}, "k8s-node"),
        ({}, platform.node()),
        ({"SLURMD_NODENAME": ""}, platform.node()),
    ],
    ids=["slurm", "kubernetes", "host-name", "empty"],
)
def test_node_name(env: dict[str, str], expected: str) -> None:
    assert bad_nodes.node_name(env) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_JOB_ID": "42"}, "42.0"),
        ({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "2"}, "42.2"),
        ({"SLURM_RESTART_COUNT": "2"}, "local"),
        ({}, "local"),
    ],
    ids=["first-run", "requeued-twice", "no-job", "no-slurm"],
)
def test_attempt(env: dict[str, str], expected: str) -> None:
    assert bad_nodes.attempt(env) == expected


@pytest.mark.parametrize(
    ("env", "job_id", "restarts"),
    [
        ({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"}, "42", None),
        ({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "SLURM_RESTART_COUNT": "1"}, "42", 1),
        ({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "SLURM_RESTART_COUNT": "x"}, "42", None),
        ({"SLURMD_NODENAME": "n1"}, "", None),
    ],
    ids=["first-run", "requeued", "garbled-count", "no-job"],
)
def test_event_takes_the_attempt_from_the_environment(
    env: dict[str, str], job_id: str, restarts: int | None, tmp_path: Path
) -> None:
    record = bad_nodes.event(
        env, reason=bad_nodes.PREFLIGHT, detail="ecc: 3 errors", exit_code=3, rank=0, now=5.0
    )
    assert (record.host, record.job_id, record.restart_count) == ("n1", job_id, restarts)
    # The file's folder is the attempt the batch shell looks in.
    folder = bad_nodes.path_for(tmp_path, record).parent.parent.name
    assert folder == bad_nodes.attempt(env)


def test_a_written_record_reads_back_where_the_batch_shell_looks(tmp_path: Path) -> None:
    path = bad_nodes.write(tmp_path, RECORD)
    assert path == tmp_path / "bad_nodes" / "42.0" / "n1" / "rank-1.json"
    assert bad_nodes.read(tmp_path) == [RECORD]
    # One short line, no temp file left beside it.
    assert path.read_text().count("\n") == 1
    assert [p.name for p in path.parent.iterdir()] == ["rank-1.json"]


@pytest.mark.parametrize(
    ("env", "restart", "name"),
    [
        ({"TORCHELASTIC_RESTART_COUNT": "2"}, {"workers_restart": 2}, "rank-1-restart-2.json"),
        ({}, {}, "rank-1.json"),
    ],
    ids=["node-mode-restart", "no-restarts"],
)
def test_the_one_writer_says_which_node_failed_and_why_in_one_line(
    env: dict[str, str], restart: dict[str, int], name: str, tmp_path: Path
) -> None:
    record = bad_nodes.event(
        {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42", **env}, reason=bad_nodes.GPU_FAULT,
        detail=RECORD.detail, exit_code=3, rank=1, now=5.0,
    )  # fmt: skip
    with structlog.testing.capture_logs() as captured:
        path = bad_nodes.write(tmp_path, record)
    said = [line for line in captured if line["event"] == "bad node"]
    assert said == [
        {"event": "bad node", "log_level": "error", "host": "n1", "reason": "gpu fault",
         "detail": RECORD.detail, **restart, "recorded": str(path)}
    ]  # fmt: skip
    # Each in-job restart of one Slurm attempt keeps its own file.
    assert path == tmp_path / "bad_nodes" / "42.0" / "n1" / name
    assert bad_nodes.read(tmp_path) == [record]


def test_write_without_a_run_dir_or_with_a_bad_host_name_writes_nothing(tmp_path: Path) -> None:
    assert bad_nodes.write(None, RECORD) is None
    assert bad_nodes.write(tmp_path, replace(RECORD, host="../etc")) is None
    assert not (tmp_path / "bad_nodes").exists()


def test_write_into_an_unwritable_run_dir_says_so_and_returns(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert bad_nodes.write(blocker, RECORD) is None


GOOD = asdict(RECORD)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ("[]", "not a JSON object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "host"}), "host missing"),
        (json.dumps({**GOOD, "exit_code": "3"}), "exit_code is str"),
        (json.dumps({**GOOD, "rank": True}), "rank is bool"),
        (json.dumps({**GOOD, "reason": "cosmic rays"}), "reason 'cosmic rays' is none of"),
        (json.dumps({**GOOD, "host": "a b"}), "host 'a b' is not a node name"),
    ],
    ids=["cut-short", "list", "no-host", "string-code", "bool-rank", "unknown-reason", "bad-host"],
)
def test_parse_names_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        bad_nodes.parse(text)


def test_parse_names_every_problem_at_once() -> None:
    text = json.dumps({k: v for k, v in GOOD.items() if k not in ("host", "rank")})
    with pytest.raises(ValueError, match="host missing; rank missing"):
        bad_nodes.parse(text)


def test_read_skips_a_damaged_record_and_keeps_the_rest(tmp_path: Path) -> None:
    bad_nodes.write(tmp_path, RECORD)
    damaged = tmp_path / "bad_nodes" / "42.0" / "n2" / "rank-3.json"
    damaged.parent.mkdir()
    damaged.write_text('{"host": "n2"')
    assert bad_nodes.read(tmp_path) == [RECORD]


def at(host: str, job_id: str, restarts: int | None) -> BadNode:
    return replace(RECORD, host=host, job_id=job_id, restart_count=restarts)


@pytest.mark.parametrize(
    ("records", "job_id", "restarts", "expected"),
    [
        ([], "42", None, []),
        ([at("n1", "42", None)], "42", None, ["n1"]),
        # The first run has no SLURM_RESTART_COUNT; 0 and unset are the same attempt.
        ([at("n1", "42", 0)], "42", None, ["n1"]),
        ([at("n1", "42", None)], "42", 1, []),
        ([at("n1", "41", None)], "42", None, []),
        ([at("n3", "42", 1), at("n1", "42", 1), at("n3", "42", 1)], "42", 1, ["n1", "n3"]),
    ],
    ids=["none", "one", "zero-is-unset", "older-attempt", "other-job", "sorted-once-each"],
)
def test_bad_hosts_of_one_attempt(
    records: list[BadNode], job_id: str, restarts: int | None, expected: list[str]
) -> None:
    assert bad_nodes.bad_hosts(records, job_id=job_id, restart_count=restarts) == expected


@pytest.mark.parametrize(("blamed", "recorder"), [(0, 1), (1, 0), (4095, 0)])
def test_the_lowest_rank_not_blamed_records_a_dead_rank(blamed: int, recorder: int) -> None:
    assert bad_nodes.dead_ranks_recorder(blamed) == recorder


DEAD = Blame(rank=1, kind="exited", text="rank 1 (n2) is gone: its process exited", host="n2")


@pytest.mark.parametrize(
    ("blame", "rank", "written"),
    [
        (DEAD, 0, True),
        # Every other survivor reaches the same verdict and leaves it to rank 0.
        (DEAD, 2, False),
        (replace(DEAD, rank=0), 1, True),
        (replace(DEAD, kind="stuck"), 0, False),
        (replace(DEAD, kind="silent", host=""), 0, False),
        (replace(DEAD, rank=None), 0, False),
    ],
    ids=["rank-0-records", "others-do-not", "rank-0-dead", "stuck", "no-host", "no-verdict"],
)
def test_one_survivor_records_a_dead_ranks_node(
    blame: Blame, rank: int, written: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    group.record_dead_ranks(blame, rank=rank, run_dir=tmp_path)
    records = bad_nodes.read(tmp_path)
    assert [(r.host, r.reason, r.exit_code, r.rank) for r in records] == (
        [("n2", bad_nodes.RANKS_DIED, 4, rank)] if written else []
    )


@pytest.mark.parametrize(
    ("flavor", "env", "expected"),
    [
        ("pytorchjob", {"TRAINBOX_NODE_NAME": "gpu-7"}, "; on Kubernetes, `kubectl cordon gpu-7`"),
        ("trainjob", {"TRAINBOX_NODE_NAME": "gpu-7"}, "; on Kubernetes, `kubectl cordon gpu-7`"),
        # A pod's own host name is no node name: say how to get one instead of a wrong command.
        ("pytorchjob", {}, "; on Kubernetes, set TRAINBOX_NODE_NAME from spec.nodeName"),
        ("srun", {"TRAINBOX_NODE_NAME": "gpu-7"}, ""),
        ("", {}, ""),
    ],
    ids=["pytorchjob", "trainjob", "no-node-name", "slurm", "by-hand"],
)
def test_the_cordon_hint_only_under_kubeflow(
    flavor: str, env: dict[str, str], expected: str
) -> None:
    hint = bad_nodes.cordon_hint(bad_nodes.node_name(env), env, flavor=flavor)
    assert hint.startswith(expected), hint
    assert bool(hint) == bool(expected), hint


def test_the_gpu_fault_error_carries_the_cordon_on_the_rank_that_saw_it() -> None:
    stopped = StoppedEarly(step=12, reason="GPU fault", checkpoint=Path("ck.pt"))
    cordon = "; on Kubernetes, `kubectl cordon gpu-7` keeps ..."
    saw = stop_error(stopped, gpu_fault="GPU 1 on host gpu-7: XID 79", cordon=cordon)
    other = stop_error(stopped, gpu_fault=None, cordon=cordon)
    assert saw.exit_code == other.exit_code == 3
    assert saw.hint.endswith(cordon)
    assert "kubectl" not in other.hint


# A single-pod PyTorchJob, as the operator sets it up (launch/kubeflow.py).
POD = {"PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "1",
       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "1"}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "host", "hint"),
    [
        ({"SLURMD_NODENAME": "n7"}, "n7", None),
        (
            {**POD, "TRAINBOX_NODE_NAME": "gpu-7"},
            "gpu-7",
            "; on Kubernetes, `kubectl cordon gpu-7`",
        ),
    ],
    ids=["slurm-node", "kubeflow-pod"],
)
def test_a_fatal_preflight_records_the_node_and_under_kubeflow_names_the_cordon(
    env: dict[str, str], host: str, hint: str | None, tmp_path: Path
) -> None:
    # No NVIDIA driver on this machine: preflight.gpus=require makes that fatal (exit 3).
    keep = {key: os.environ[key] for key in ("PATH", "HOME", "PYTHONPATH") if key in os.environ}
    proc = subprocess.run(
        [sys.executable, "-m", "trainbox", "run", f"run_dir={tmp_path}", "preflight.gpus=require"],
        env=keep | env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    records = bad_nodes.read(tmp_path)
    assert [(r.host, r.reason, r.exit_code, r.rank) for r in records] == [
        (host, bad_nodes.PREFLIGHT, 3, 0)
    ]
    assert records[0].detail.startswith("driver: ")
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("trainbox: error: driver: ")
    assert (hint in error) if hint else ("kubectl" not in error), error
