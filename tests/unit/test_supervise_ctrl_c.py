"""Node mode's supervisor and Ctrl-C: one press reaches the agent once; a second press ends the
agent and its workers at once with 130 (issue 19, item 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainbox.process import preempt

# A supervisor in a process of its own, running an "agent" given as Python source; it prints
# its pid once the agent runs, so the test knows where to press Ctrl-C.
SUPERVISOR = """
import os, subprocess, sys
from trainbox.process import supervise
from trainbox.process.exec_plan import ExecPlan

def popen(*args, **kwargs):
    agent = subprocess.Popen(*args, **kwargs)
    print("ready", flush=True)
    return agent

target = ExecPlan(argv=(sys.executable, "-c", sys.argv[1]), env=dict(os.environ))
sys.exit(supervise.run(target, deadline_at=None, reap_timeout_s=0.5, popen=popen))
"""
# Counts the INTs it gets into a file; a worker of its own would run for ten minutes.
COUNTING_AGENT = """
import os, signal, subprocess, sys, time
count = 0
def interrupted(*_):
    global count
    count += 1
    open(sys.argv[1], "w").write(str(count))
signal.signal(signal.SIGINT, interrupted)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1] + ".worker", "w").write(str(worker.pid))
time.sleep(600)
"""


def start(tmp_path: Path) -> subprocess.Popen[str]:
    agent = COUNTING_AGENT.replace("sys.argv[1]", repr(str(tmp_path / "ints")))
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, agent], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


def wait_for(path: Path) -> str:
    deadline = time.monotonic() + 20
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def test_a_second_ctrl_c_ends_the_agent_and_its_workers_with_130(tmp_path: Path) -> None:
    proc = start(tmp_path)
    worker = int(wait_for(tmp_path / "ints.worker"))
    # Ctrl-C as a terminal sends it: to the foreground group, which the agent is not in.
    os.killpg(proc.pid, signal.SIGINT)
    assert wait_for(tmp_path / "ints") == "1"
    os.killpg(proc.pid, signal.SIGINT)  # the same press again within the echo window: ignored
    time.sleep(preempt.ECHO_S + 0.5)  # a person's second press
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr[-2000:]
    assert (tmp_path / "ints").read_text() == "1"
    assert "aborting now, without a checkpoint" in stderr
    assert (
        not Path(f"/proc/{worker}").exists()
        or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]
    )
