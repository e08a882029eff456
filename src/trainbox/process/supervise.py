"""Node mode's parent: runs torchrun's agent as a child, passes signals on, reports why it ended.

torchrun exits 1 whatever went wrong in a worker, and on a signal it dies of it; the workers
leave their own exit codes in a directory so the node exits with the documented code.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from trainbox.logs import log
from trainbox.process import preempt
from trainbox.process.exec_plan import ExecPlan

OUTCOME_DIR = "TRAINBOX_OUTCOME_DIR"
# Passed on to the agent, which (told by exec_plan.AGENT_SIGNALS) passes them to its workers.
FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# A worker's own code explains the node's failure best; the first found in this order wins:
# bad configuration, a bad node, peers that cannot meet, then a clean preemption stop.
PRIORITY = (2, 3, 4, 143)
# How long workers that outlived their agent may take to finish (a checkpoint being written)
# before they are told to stop, then killed: Kubernetes' default grace is 30 s, ours 120 s.
REAP_TIMEOUT_S = 60.0
# A second Ctrl-C: the code a shell gives a process killed by SIGINT (128 + 2).
ABORTED = 130
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def exit_code(agent_rc: int, reported: Mapping[int, int], *, workers: int) -> int:
    """The node's exit code from torchrun's and the codes its `workers` reported (by rank)."""
    if agent_rc == 0:
        return 0
    if workers and len(reported) == workers and not any(reported.values()):
        # Every worker finished its work; the agent died after that (a late stop signal).
        return 0
    codes = set(reported.values())
    for code in PRIORITY:
        if code in codes:
            return code
    # Popen reports death by signal N as -N; shells and schedulers say 128 + N.
    return 128 - agent_rc if agent_rc < 0 else agent_rc


def record_exit_code(env: Mapping[str, str], code: int) -> None:
    """Leave this worker's exit code for the supervisor, when there is one."""
    directory = env.get(OUTCOME_DIR)
    if not directory or "RANK" not in env:
        return
    # A round of workers is its restart count and world size: a node joining an elastic job
    # re-forms the group without counting a restart, but always into a larger world.
    restarts = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    world = int(env.get("WORLD_SIZE", "1") or 1)
    with contextlib.suppress(OSError):
        Path(directory, f"{restarts:06d}-{world:06d}-{env['RANK']}").write_text(str(code))


def recorded_exit_codes(directory: Path) -> dict[int, int]:
    """The codes of the newest round's workers, by rank."""
    found: dict[str, dict[int, int]] = {}
    for path in directory.iterdir():
        round_name, _, rank = path.name.rpartition("-")
        try:
            found.setdefault(round_name, {})[int(rank)] = int(path.read_text())
        except ValueError:
            continue  # a file cut short by a kill says nothing
    return found[max(found)] if found else {}


def run(
    target: ExecPlan,
    *,
    deadline_at: float | None,
    reap_timeout_s: float = REAP_TIMEOUT_S,
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
) -> int:
    """Run the agent to the end, as its node's one process; returns the node's exit code."""
    # Workers outlive an agent that dies of a second signal mid-shutdown; as their subreaper
    # this process can wait for them, so it never exits while one is still saving.
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    forwarder = _Forwarder()
    # Before the agent starts: a signal in between is held and passed on once it runs.
    for sig in FORWARDED:
        signal.signal(sig, forwarder.receive)
    with (
        tempfile.TemporaryDirectory(prefix="trainbox-outcome-") as directory,
        tempfile.TemporaryDirectory(prefix="trainbox-torchelastic-") as agent_logs,
    ):
        env = {**target.env, OUTCOME_DIR: directory, preempt.SUPERVISED: "1"}
        argv = _with_log_dir(target.argv, agent_logs)
        # A session of its own: a terminal's Ctrl-C reaches the agent once, through us, not
        # twice (a second INT cuts torchrun's own shutdown short).
        agent = popen(argv, env=env, preexec_fn=_die_with_parent, start_new_session=True)
        forwarder.attach(agent)
        agent_rc = _wait(agent, deadline_at)
        _reap_orphans(reap_timeout_s)
        code = exit_code(agent_rc, recorded_exit_codes(Path(directory)), workers=target.workers)
        if forwarder.aborted:
            code = ABORTED
    log.info("node finished", agent_exit=agent_rc, exit_code=code)
    return code


def _with_log_dir(argv: Sequence[str], log_dir: str) -> list[str]:
    """torchrun's argv with its log folder in `log_dir`, which goes when the node finishes.

    Without one, torchrun makes /tmp/torchelastic_* for each run and never removes it: under
    Apptainer that is the node's /tmp, shared by every job.
    """
    argv = list(argv)
    if "torch.distributed.run" not in argv:
        return argv
    at = argv.index("torch.distributed.run") + 1
    return [*argv[:at], f"--log-dir={log_dir}", *argv[at:]]


class _Forwarder:
    """Passes signals to the agent; holds those that come before it exists."""

    def __init__(self) -> None:
        self.agent: subprocess.Popen[bytes] | None = None
        self.held: list[int] = []
        # time.monotonic() of the first Ctrl-C; None before one.
        self.first_ctrl_c_at: float | None = None
        # A second Ctrl-C killed the agent and its workers.
        self.aborted = False

    def receive(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if signum == signal.SIGINT:
            now = time.monotonic()
            action = preempt.ctrl_c_action(self.first_ctrl_c_at, now)
            if action == "echo":
                return
            if action == "abort":
                self._abort()
                return
            self.first_ctrl_c_at = now
        if self.agent is None:
            self.held.append(signum)
        else:
            _forward(self.agent, signum)

    def _abort(self) -> None:
        """A second Ctrl-C: end the agent and every worker now; no checkpoint is waited for."""
        os.write(2, preempt.SECOND_CTRL_C)
        self.aborted = True
        if self.agent is None:
            raise SystemExit(ABORTED)
        # Workers first: torchrun's agent would otherwise start tearing them down itself.
        for pid in [*_descendants(self.agent.pid), self.agent.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def attach(self, agent: subprocess.Popen[bytes]) -> None:
        self.agent = agent
        for signum in self.held:
            _forward(agent, signum)
        self.held.clear()


def _wait(agent: subprocess.Popen[bytes], deadline_at: float | None) -> int:
    while True:
        timeout = None if deadline_at is None else max(deadline_at - time.time(), 0.0)
        try:
            return agent.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("deadline reached: asking the workers to checkpoint and stop")
            _forward(agent, signal.SIGTERM)
            deadline_at = None


def _forward(agent: subprocess.Popen[bytes], signum: int) -> None:
    if agent.poll() is None:
        agent.send_signal(signum)


def _reap_orphans(timeout_s: float) -> None:
    """Wait for workers the agent left behind; after timeout_s, TERM them, then KILL them."""
    deadline = time.monotonic() + timeout_s
    escalation = iter((signal.SIGTERM, signal.SIGKILL))
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if pid:
            continue
        if time.monotonic() >= deadline:
            sig = next(escalation, signal.SIGKILL)
            log.warning("workers outlived the agent: signalling them", signal=sig.name)
            for child in _children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, sig)
            deadline = time.monotonic() + min(timeout_s, 10.0)
        time.sleep(0.05)


def _children() -> list[int]:
    """This process's children (orphans re-parented here included), from /proc."""
    return _parents().get(os.getpid(), [])


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc."""
    tree, found, todo = _parents(), [], [pid]
    while todo:
        children = tree.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _parents() -> dict[int, list[int]]:
    """Each process's children, by parent pid, from /proc."""
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name may hold spaces or parentheses: fields start after the last ')'.
            fields = stat.read_text().rpartition(")")[2].split()
            tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def _die_with_parent() -> None:
    # If this supervisor is killed outright, its agent must not train on unsupervised.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _prctl(option: int, value: int) -> None:
    # Not Linux: no subreaper and no parent-death signal, which only narrows what is caught.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
