"""The keeper of dist.recovery=in_process: when it becomes one, what it replaces a trainer for,
and what it does with real child processes (small scripts standing in for the trainer and the
spare: a real trainbox run is tests/dist/test_in_process_recovery.py's)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from trainbox.process import keeper
from trainbox.process.keeper import Keeper, Promotion

AGENT = {"TORCHELASTIC_USE_AGENT_STORE": "True", "RANK": "1"}


@pytest.mark.parametrize(
    ("env", "recovery", "expected"),
    [
        (AGENT, "in_process", True),
        (AGENT, "restart", False),
        ({**AGENT, keeper.ROLE: "trainer"}, "in_process", False),
        ({**AGENT, keeper.ROLE: "spare"}, "in_process", False),
        ({"RANK": "1"}, "in_process", False),
        ({"TORCHELASTIC_USE_AGENT_STORE": "True"}, "in_process", False),
    ],
    ids=["torchrun-worker", "restart", "kept-trainer", "kept-spare", "no-agent", "no-rank"],
)
def test_who_becomes_a_keeper(env: dict[str, str], recovery: str, expected: bool) -> None:
    assert keeper.kept(env, recovery=recovery) is expected


@pytest.mark.parametrize(
    ("returncode", "cause"),
    [
        (-signal.SIGKILL, "SIGKILL"),
        (-signal.SIGSEGV, "SIGSEGV"),
        (-signal.SIGBUS, "SIGBUS"),
        (-signal.SIGABRT, "SIGABRT"),
        (-signal.SIGTERM, None),
        (-signal.SIGINT, None),
        (0, None),
        (1, None),
        (2, None),
        (4, None),
        (143, None),
    ],
)
def test_only_a_lost_process_is_replaced(returncode: int, cause: str | None) -> None:
    # An exit code is the rank's answer (a bug, a bad config, an agreed stop): a spare would
    # only give it again.
    assert keeper.cause_of(returncode) == cause


def test_a_promotion_reads_back_as_written() -> None:
    promotion = Promotion(predecessors=(11, 12), cause="SIGKILL", died_at=1.5)
    line = promotion.to_line()
    assert line.count(b"\n") == 1
    assert line.endswith(b"\n")
    assert Promotion.from_line(line) == promotion


# Stands in for `trainbox run`: a trainer ends as ACT says; a spare writes the promotion it
# reads to OUT and exits 0, or exits 7 when its pipe closes unread.
STAND_IN = """
import os, signal, sys
role, act, out = os.environ["TRAINBOX_ROLE"], sys.argv[1], sys.argv[2]
if role == "trainer":
    if act == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if act == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    sys.exit(int(act))
with os.fdopen(int(os.environ["TRAINBOX_SPARE_FD"]), "rb") as pipe:
    line = pipe.readline()
if not line:
    sys.exit(7)
open(out, "wb").write(line)
"""


def keep(tmp_path: Path, act: str, *, max_recoveries: int = 1) -> tuple[int, Path]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    out = tmp_path / "promotion.json"
    command = [sys.executable, str(script), act, str(out)]
    kept = Keeper(command, {}, max_recoveries=max_recoveries, stopped_polls=3)
    return kept.run(), out


def test_a_killed_trainer_is_replaced_by_its_spare(tmp_path: Path) -> None:
    code, out = keep(tmp_path, "kill")
    assert code == 0, "the keeper's code is the spare's, which took the rank over"
    told = json.loads(out.read_text())
    assert told["cause"] == "SIGKILL"
    assert len(told["predecessors"]) == 1


def test_a_stopped_trainer_is_killed_and_replaced(tmp_path: Path) -> None:
    code, out = keep(tmp_path, "stop")
    assert code == 0
    assert json.loads(out.read_text())["cause"] == "stopped"


@pytest.mark.parametrize("exit_code", [0, 1, 143])
def test_a_trainer_that_exits_ends_the_keeper_with_its_code(tmp_path: Path, exit_code: int) -> None:
    code, out = keep(tmp_path, str(exit_code))
    assert code == exit_code
    assert not out.exists(), "the spare was never promoted"


def test_without_recoveries_left_a_killed_trainer_ends_the_keeper(tmp_path: Path) -> None:
    code, out = keep(tmp_path, "kill", max_recoveries=0)
    # Shells and schedulers say 128 + N for death by signal N; torchrun then takes over.
    assert code == 128 + signal.SIGKILL
    assert not out.exists()
