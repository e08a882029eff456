"""slurm/common.sh's pure parts: which hosts an attempt recorded bad, what the step's exit code
stands for, how many node retries a job has had, how many nodes are usable, and whether to
requeue without the bad ones.

Each runs in a real bash with common.sh sourced, as the batch shell runs it; Slurm itself (the
requeue) is tested on the local cluster in tests/launchers/test_node_exclusion_slurm.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trainbox.process import bad_nodes

COMMON = Path(__file__).parents[2] / "slurm" / "common.sh"


def shell(script: str, *args: str, stdin: str = "") -> str:
    """Run `script` in bash after sourcing common.sh, with `args` as $1...; its stdout."""
    proc = subprocess.run(
        ["bash", "-c", f'source "{COMMON}"; {script}', "bash", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    return proc.stdout


@pytest.mark.parametrize(
    ("rc", "retried", "allowed", "needed", "usable", "bad", "expected"),
    [
        ("3", "0", "2", "1", "1", "n1", "requeue"),
        ("4", "1", "2", "2", "2", "n1 n3", "requeue"),
        ("3", "0", "2", "1", "1", "", "stop: no bad node recorded for this attempt"),
        ("3", "2", "2", "1", "1", "n1", "stop: n1 failed it, and the job came back without a bad"
         " node 2 time(s) already (TRAINBOX_NODE_RETRIES=2)"),
        ("3", "0", "0", "1", "1", "n1", "stop: n1 failed it, and the job came back without a bad"
         " node 0 time(s) already (TRAINBOX_NODE_RETRIES=0)"),
        ("4", "0", "2", "2", "1", "n1", "stop: n1 failed it; without n1 the partition has 1"
         " usable node(s) and the job needs 2"),
    ],
    ids=["gpu-fault", "ranks-died-second-retry", "nothing-recorded", "retries-used-up",
         "retries-off", "too-few-nodes"],
)  # fmt: skip
def test_the_requeue_decision(
    rc: str, retried: str, allowed: str, needed: str, usable: str, bad: str, expected: str
) -> None:
    out = shell('trainbox_node_decision "$@"', rc, retried, allowed, needed, usable, bad, "n1")
    assert out.startswith(expected), out


def record(
    run_dir: Path, host: str, job: str, restarts: int | None, rank: int = 0, exit_code: int = 3
) -> None:
    event = bad_nodes.BadNode(host=host, reason=bad_nodes.GPU_FAULT, detail="XID 79",
                              exit_code=exit_code, rank=rank, job_id=job, restart_count=restarts,
                              time=0.0)  # fmt: skip
    assert bad_nodes.write(run_dir, event) is not None


def test_the_shell_reads_the_hosts_the_python_reader_reads(tmp_path: Path) -> None:
    # Two ranks of n3 and one of n1 in attempt 7.1; other attempts and jobs are not this one's.
    for host, job, restarts, rank in [("n3", "7", 1, 0), ("n3", "7", 1, 1), ("n1", "7", 1, 4),
                                      ("n2", "7", None, 0), ("n4", "8", 1, 0)]:  # fmt: skip
        record(tmp_path, host, job, restarts, rank)
    got = shell('trainbox_bad_hosts "$@"', str(tmp_path), "7", "1").split()
    assert got == ["n1", "n3"]
    assert got == bad_nodes.bad_hosts(bad_nodes.read(tmp_path), job_id="7", restart_count=1)
    assert shell('trainbox_bad_hosts "$@"', str(tmp_path), "9", "0") == ""


def test_the_shell_reads_the_exit_codes_recorded_for_this_attempt(tmp_path: Path) -> None:
    for host, restarts, rank, code in [("n3", 1, 0, 4), ("n3", 1, 1, 4), ("n1", 1, 2, 3),
                                       ("n2", None, 0, 3)]:  # fmt: skip
        record(tmp_path, host, "7", restarts, rank, exit_code=code)
    assert shell('trainbox_bad_codes "$@"', str(tmp_path), "7", "1").strip() == "3 4"
    assert shell('trainbox_bad_codes "$@"', str(tmp_path), "7", "5").strip() == ""


@pytest.mark.parametrize(
    ("rc", "recorded", "expected"),
    [
        ("0", "", "0"),
        # A preemption: no node recorded bad, the step checkpointed and exited 143.
        ("143", "", "143"),
        # One node failed preflight (3); --kill-on-bad-exit stopped the others, which exit 143
        # as if preempted, and srun reports the highest code: the record says what happened.
        ("143", "3", "3"),
        ("143", "3 4", "3"),
        ("4", "4", "4"),
        ("1", "", "1"),
    ],
    ids=["finished", "preempted", "one-node-failed", "two-kinds", "ranks-died", "other-error"],
)
def test_the_step_code_is_the_bad_nodes_when_one_was_recorded(
    rc: str, recorded: str, expected: str
) -> None:
    assert shell('trainbox_step_code "$@"', rc, recorded).strip() == expected


@pytest.mark.parametrize(
    ("attempts", "restarts", "expected"),
    [
        ([], "0", "0"),
        ([("7", None)], "0", "0"),
        ([("7", None)], "1", "1"),
        # A preemption requeue (no record) in between is not a node retry.
        ([("7", None), ("7", 2)], "3", "2"),
        ([("8", None)], "1", "0"),
    ],
    ids=["first-run", "this-attempt", "one-before", "two-before", "other-job"],
)
def test_node_retries_done(
    attempts: list[tuple[str, int | None]], restarts: str, expected: str, tmp_path: Path
) -> None:
    for job, count in attempts:
        record(tmp_path, "n1", job, count)
    assert (
        shell('trainbox_node_retries_done "$@"', str(tmp_path), "7", restarts).strip() == expected
    )


@pytest.mark.parametrize(
    ("sinfo", "excluded", "expected"),
    [
        ("n1 idle\nn2 alloc\n", "", "2"),
        ("n1 idle\nn2 alloc\n", "n1", "1"),
        ("n1 mix\nn2 down*\nn3 drain\nn4 drng\nn5 idle~\n", "", "2"),
        # sinfo -N lists a node once per partition it is in.
        ("n1 idle\nn1 idle\n", "", "1"),
        ("n10 idle\n", "n1", "1"),
    ],
    ids=["all-up", "one-excluded", "down-and-drained", "listed-twice", "prefix-is-not-a-match"],
)
def test_usable_nodes(sinfo: str, excluded: str, expected: str) -> None:
    assert shell('trainbox_usable_nodes "$1"', excluded, stdin=sinfo).strip() == expected
