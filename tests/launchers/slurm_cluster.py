"""A real two-node Slurm cluster (munged, slurmctld, two slurmd) on loopback, for tests.

Everything except munge lives in one temp dir; clients find it through SLURM_CONF.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import hosts

NODES: tuple[str, ...] = ("n1", "n2")
PARTITION = "debug"
# Each fake node advertises 2 CPUs so `--ntasks-per-node=2` fits, whatever the real core count.
CPUS_PER_NODE = 2
REQUIRED_COMMANDS: tuple[str, ...] = (
    "slurmctld",
    "slurmd",
    "slurmstepd",
    "srun",
    "sbatch",
    "squeue",
    "scancel",
    "scontrol",
    "sinfo",
    "munged",
    "munge",
    "unmunge",
)
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN_DIR = Path("/run/munge")
# A job in any other state has left the queue for good.
ACTIVE_JOB_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESV_DEL_HOLD",
        "SIGNALING",
        "STAGE_OUT",
    }
)
# An outer Slurm job's variables would make srun/sbatch attach to that job, not ours.
_FOREIGN_ENV_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_")


# (name, process) of each daemon started, in start order.
Daemons = Sequence[tuple[str, "subprocess.Popen[bytes]"]]


class SlurmClusterError(RuntimeError):
    """The local cluster failed to start, or a client command or job misbehaved."""


@dataclass(frozen=True, kw_only=True)
class SlurmCluster:
    """Handle on a running local cluster: where it lives and how to talk to it."""

    conf: Path  # slurm.conf that the daemons and (via SLURM_CONF) all clients read
    workdir: Path  # temp dir holding conf, state, spool dirs, logs and pid files
    nodes: tuple[str, ...]  # Slurm node names, which also resolve (to 127.0.0.1) as host names
    partition: str  # the single, default partition spanning all nodes
    cpus_per_node: int  # CPUs each node advertises to the scheduler
    env: dict[str, str]  # environment for client commands and job steps (SLURM_CONF, venv PATH)
    logs: tuple[Path, ...]  # daemon log files, slurmctld first, for diagnostics

    def run(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (srun, sbatch, squeue, ...) with the cluster env plus `env`."""
        merged = {**self.env, **(env or {})}
        return subprocess.run(
            argv,
            env=merged,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def sbatch(
        self,
        script: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        script_args: Sequence[str] = (),
    ) -> int:
        """Submit `script` (sbatch options `args`, the script's own `script_args`); its job id."""
        argv = ["sbatch", "--parsable", *args, str(script), *script_args]
        proc = self.run(argv, env=env, timeout=60)
        if proc.returncode != 0:
            raise SlurmClusterError(
                f"sbatch {script} failed (rc={proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        # --parsable prints "jobid" or "jobid;cluster".
        return int(proc.stdout.strip().split(";", 1)[0])

    def job_info(self, job_id: int) -> dict[str, str]:
        """Return `scontrol show job` fields for `job_id` (empty if Slurm forgot it)."""
        proc = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=30)
        if proc.returncode != 0:
            return {}
        fields: dict[str, str] = {}
        # One line of Key=Value tokens; values we care about (JobState, ExitCode) have no spaces.
        for token in proc.stdout.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def wait_job(self, job_id: int, *, timeout: float = 120) -> str:
        """Wait until the job has left the queue and return its final state (e.g. COMPLETED)."""
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_info(job_id).get("JobState", "UNKNOWN")
            if state not in ACTIVE_JOB_STATES and state != "UNKNOWN":
                return state
            time.sleep(0.2)
        raise SlurmClusterError(
            f"job {job_id} still {state} after {timeout:.0f}s\n{self.diagnostics(job_id)}"
        )

    def wait_running(self, job_id: int, *, timeout: float = 60) -> None:
        """Wait until the job is RUNNING (fails if it ends or stays pending)."""
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_info(job_id).get("JobState", "UNKNOWN")
            if state == "RUNNING":
                return
            if state not in ACTIVE_JOB_STATES and state != "UNKNOWN":
                break
            time.sleep(0.1)
        raise SlurmClusterError(
            f"job {job_id} is {state}, not RUNNING, after waiting up to {timeout:.0f}s\n"
            + self.diagnostics(job_id)
        )

    def popen(
        self, argv: list[str], *, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Start a client command (a long srun) in the background with the cluster env plus
        `env`; its stdout and stderr come merged, as text lines, from the returned Popen's stdout."""
        return subprocess.Popen(
            argv,
            env={**self.env, **(env or {})},
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )

    def job_ids(self, name: str) -> list[int]:
        """Ids of the jobs named `name` that are still in the queue (pending or running)."""
        proc = self.run(["squeue", "-h", f"--name={name}", "-o", "%i"], timeout=30)
        if proc.returncode != 0:
            raise SlurmClusterError(f"squeue failed (rc={proc.returncode}): {proc.stderr}")
        return [int(line) for line in proc.stdout.split()]

    def wait_gone(self, name: str, *, timeout: float = 60) -> None:
        """Wait until no job named `name` is left in the queue (completing ones included)."""
        deadline = time.monotonic() + timeout
        while self.job_ids(name):
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"job {name} still queued after {timeout:.0f}s\n{self.diagnostics()}"
                )
            time.sleep(0.1)

    def wait_until(
        self,
        job_id: int,
        ready: Callable[[dict[str, str]], bool],
        *,
        what: str,
        timeout: float = 60,
    ) -> dict[str, str]:
        """Poll `scontrol show job` until `ready(fields)`; those fields. `what` names the wait
        in the error raised on timeout."""
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job_info(job_id)
            if ready(info):
                return info
            time.sleep(0.1)
        raise SlurmClusterError(
            f"job {job_id}: no {what} after {timeout:.0f}s (JobState={info.get('JobState')})\n"
            + self.diagnostics(job_id)
        )

    def wait_for_output(self, job_id: int, output: Path, text: str, *, timeout: float) -> None:
        """Poll a batch job's output file until it holds `text`, while the job is alive."""
        deadline = time.monotonic() + timeout
        while text not in _read(output):
            state = self.job_info(job_id).get("JobState")
            if state not in ("PENDING", "CONFIGURING", "RUNNING"):
                raise SlurmClusterError(
                    f"job {job_id} is {state} before {text!r} in its output\n"
                    f"{_read(output)[-3000:]}\n{self.diagnostics(job_id)}"
                )
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"no {text!r} after {timeout:.0f}s\n{_read(output)[-3000:]}"
                )
            time.sleep(0.1)

    def preempt_batch(self, job_id: int, *, timeout: float) -> dict[str, str]:
        """Do what `--signal=B:USR1@T` does T seconds before the time limit (USR1 to the batch
        shell only), wait until the job has requeued itself, and let it start again at once.
        Returns its fields as requeued."""
        sent = self.run(["scancel", "--signal=USR1", "--batch", str(job_id)], timeout=30)
        if sent.returncode != 0:
            raise SlurmClusterError(f"scancel --signal=USR1 failed: {sent.stderr}")
        info = self.wait_until(
            job_id,
            lambda i: i.get("Restarts") == "1" and i.get("JobState") in ("PENDING", "RUNNING"),
            what="requeue (Restarts=1)",
            timeout=timeout,
        )
        # Slurm 22.05 does not hold a job that requeues itself with `scontrol requeue`: it goes
        # back to PENDING with Reason=BeginTime, eligible only a credential lifetime + 1 s later
        # (AuthInfo cred_expire, default 120 s), so that no launch credential of the killed run
        # is still good. Skip the two minutes, but not at once: slurmd rejects a credential made
        # in the same second as the old run's revocation ("credential revoked"), so 2 s from now.
        if info["JobState"] == "PENDING" and not info.get("Reason", "").startswith("JobHeld"):
            moved = self.run(
                ["scontrol", "update", f"JobId={job_id}", "StartTime=now+2"], timeout=30
            )
            if moved.returncode != 0:
                raise SlurmClusterError(f"scontrol update failed: {moved.stdout}{moved.stderr}")
        return info

    def diagnostics(self, job_id: int | None = None) -> str:
        """Queue, node states and daemon log tails, for assertion and error messages."""
        parts = []
        if job_id is not None:
            parts.append(self.run(["scontrol", "show", "job", str(job_id)], timeout=30).stdout)
        parts.append(self.run(["squeue", "-a"], timeout=30).stdout)
        parts.append(self.run(["sinfo", "-N", "-l"], timeout=30).stdout)
        parts.extend(_log_tail(log) for log in self.logs)
        return "\n".join(parts)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def missing_requirements() -> str | None:
    """Why a local Slurm cluster cannot run here, or None if it can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd, munged setup and /etc/hosts)"
    missing = [name for name in REQUIRED_COMMANDS if _which(name) is None]
    if missing:
        return (
            f"missing commands: {', '.join(missing)} "
            "(apt-get install slurm-wlm munge; see .ci/install-system)"
        )
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (install the munge package)"
    return None


@contextlib.contextmanager
def start_cluster(
    base: Path, *, python_bin_dir: Path | None = None, cpus_per_node: int = CPUS_PER_NODE
) -> Iterator[SlurmCluster]:
    """Start munged (unless one works), slurmctld and slurmd n1/n2 under `base`; stop on exit.

    `cpus_per_node` is what each node advertises (benchmarks/many_ranks.py asks 16 per node)."""
    reason = missing_requirements()
    if reason is not None:
        raise SlurmClusterError(reason)
    workdir = base.resolve()
    # slurmd puts unix sockets (<spool>/<node>_<job>.<step>) there; sun_path holds 108 bytes.
    if len(str(workdir)) > 60:
        raise SlurmClusterError(f"base dir too long for slurmd's unix sockets: {workdir}")
    workdir.mkdir(parents=True, exist_ok=True)
    # Training uses the node names as MASTER_ADDR.
    hosts.add_loopback(NODES, why="trainbox test slurm nodes")
    env = _client_env(workdir / "slurm.conf", python_bin_dir)
    logs = tuple(workdir / "log" / f"{name}.log" for name in ("slurmctld", *_slurmd_names()))
    cluster = SlurmCluster(
        conf=workdir / "slurm.conf",
        workdir=workdir,
        nodes=NODES,
        partition=PARTITION,
        cpus_per_node=cpus_per_node,
        env=env,
        logs=logs,
    )
    daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
    munged: subprocess.Popen[bytes] | None = None
    try:
        munged = _ensure_munged(workdir)
        _write_conf(workdir, cpus_per_node)
        # -D: stay in the foreground so we own the process; -c: ignore any saved state.
        ctld = _spawn(["slurmctld", "-D", "-c", "-f", str(cluster.conf)], workdir, "slurmctld")
        daemons.append(("slurmctld", ctld))
        _wait_ctld(cluster, daemons)
        for node in NODES:
            argv = ["slurmd", "-D", "-N", node, "-f", str(cluster.conf)]
            daemons.append((f"slurmd {node}", _spawn(argv, workdir, f"slurmd-{node}")))
        _wait_nodes_idle(cluster, daemons)
        yield cluster
    finally:
        if daemons:
            _cancel_all_jobs(cluster)
        # Reverse start order: slurmd before slurmctld, then sweep up detached slurmstepds.
        for _, proc in reversed(daemons):
            _stop(proc)
        if daemons:
            _kill_strays(cluster.conf, [proc.pid for _, proc in daemons])
        if munged is not None:
            _stop(munged)


def _slurmd_names() -> tuple[str, ...]:
    """Log/capture base names of the per-node slurmd daemons."""
    return tuple(f"slurmd-{node}" for node in NODES)


def _which(name: str) -> str | None:
    """shutil.which that also looks in sbin dirs, which a non-login root PATH may lack."""
    path = os.environ.get("PATH", os.defpath) + ":/usr/local/sbin:/usr/sbin:/sbin"
    return shutil.which(name, path=path)


def _client_env(conf: Path, python_bin_dir: Path | None) -> dict[str, str]:
    """The caller's env minus foreign Slurm vars, plus SLURM_CONF and the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV_PREFIXES)}
    path = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p]
    for extra in ("/usr/local/sbin", "/usr/sbin", "/sbin"):
        if extra not in path:
            path.append(extra)
    if python_bin_dir is not None:
        path.insert(0, str(python_bin_dir))
    env["PATH"] = os.pathsep.join(path)
    env["SLURM_CONF"] = str(conf)
    return env


def _free_ports(count: int) -> list[int]:
    """`count` distinct free ports; all sockets stay open until the end so none repeats."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _munge_works() -> bool:
    """True if a munged answers on the default socket and round-trips a credential."""
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
        if cred.returncode != 0:
            return False
        back = subprocess.run(
            ["unmunge"], input=cred.stdout, capture_output=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return back.returncode == 0


def _ensure_munged(workdir: Path) -> subprocess.Popen[bytes] | None:
    """Reuse a working munged, else start one (returned so teardown can stop it)."""
    if _munge_works():
        return None
    user = pwd.getpwnam("munge")
    MUNGE_RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chown(MUNGE_RUN_DIR, user.pw_uid, user.pw_gid)
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(MUNGE_KEY.parent, user.pw_uid, user.pw_gid)
        subprocess.run(["mungekey", "--create", "--keyfile", str(MUNGE_KEY)], check=True)
    # munged refuses a key that other users can read or that it does not own.
    key_stat = MUNGE_KEY.stat()
    if key_stat.st_uid != user.pw_uid:
        os.chown(MUNGE_KEY, user.pw_uid, user.pw_gid)
    if key_stat.st_mode & 0o077:
        MUNGE_KEY.chmod(0o400)
    for var_dir in (Path("/var/lib/munge"), Path("/var/log/munge")):
        var_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(var_dir, user.pw_uid, user.pw_gid)
    # --foreground logs to stderr (captured in log/munged.out); --force: a munged killed
    # earlier may have left its socket behind.
    proc = _spawn(["munged", "--foreground", "--force"], workdir, "munged", user="munge")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if _munge_works():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    _stop(proc)
    raise SlurmClusterError(f"munged did not come up\n{_log_tail(workdir / 'log' / 'munged.out')}")


def _write_conf(workdir: Path, cpus: int) -> None:
    """Write slurm.conf with fresh ports and every path inside `workdir`."""
    ctld_port, *slurmd_ports = _free_ports(1 + len(NODES))
    host = socket.gethostname().split(".", 1)[0]
    for sub in ("state", "log", "run", "spool", "tmp"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    for node in NODES:
        (workdir / "spool" / node).mkdir(parents=True, exist_ok=True)
    node_lines = [
        f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
        f"CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} "
        "ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
        for node, port in zip(NODES, slurmd_ports, strict=True)
    ]
    lines = [
        "ClusterName=trainbox",
        # slurmctld only serves if the short hostname matches; 127.0.0.1 keeps traffic on loopback.
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={workdir / 'state'}",
        f"SlurmdSpoolDir={workdir / 'spool' / '%n'}",
        f"SlurmctldPidFile={workdir / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={workdir / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={workdir / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={workdir / 'log' / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"TmpFS={workdir / 'tmp'}",
        # No cgroups: they are often unusable in containers and sandboxes.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        # No MTA here; the default /usr/bin/mail makes slurmctld log an error at startup.
        "MailProg=/bin/true",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        # Use the configured CPUs even if the host has fewer, instead of marking nodes INVALID.
        "SlurmdParameters=config_overrides",
        # setrlimit propagation can fail in sandboxes and is useless on one host.
        "PropagateResourceLimits=NONE",
        # A node that (re)registers is usable at once, whatever state it was in.
        "ReturnToService=2",
        # Schedule on every event and poll each second, so jobs start without delay.
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1,bf_interval=1,sched_min_interval=0",
        # Keep finished jobs visible to `scontrol show job` long enough to read their state.
        "MinJobAge=300",
        # Generous timeouts: a loaded CI box must not mark nodes down mid-test.
        "SlurmctldTimeout=300",
        "SlurmdTimeout=300",
        "MessageTimeout=30",
        "BatchStartTimeout=60",
        "InactiveLimit=0",
        "UnkillableStepTimeout=60",
        # Quick cancels: SIGKILL follows SIGTERM after 2s.
        "KillWait=2",
        "Waittime=0",
        "CompleteWait=0",
        *node_lines,
        f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE "
        "State=UP OverSubscribe=YES",
    ]
    (workdir / "slurm.conf").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _spawn(
    argv: list[str], workdir: Path, name: str, *, user: str | None = None
) -> subprocess.Popen[bytes]:
    """Start a foreground daemon in its own session; stdout/stderr go to log/<name>.out."""
    out = workdir / "log" / f"{name}.out"
    out.parent.mkdir(parents=True, exist_ok=True)
    exe = _which(argv[0])
    if exe is None:
        raise SlurmClusterError(f"{argv[0]} not found")
    with out.open("ab") as sink:
        return subprocess.Popen(
            [exe, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            # Own session: a Ctrl-C aimed at pytest must not kill daemons before teardown runs,
            # and teardown can sweep up whatever stays in the session.
            start_new_session=True,
            user=user,
            group=user,
            extra_groups=[] if user else None,
        )


def _check_alive(cluster: SlurmCluster, daemons: Daemons) -> None:
    """Fail fast, with logs, if a daemon we started has already exited."""
    for name, proc in daemons:
        if proc.poll() is not None:
            raise SlurmClusterError(
                f"{name} exited with rc={proc.returncode} during startup\n" + _startup_logs(cluster)
            )


def _startup_logs(cluster: SlurmCluster) -> str:
    """Tails of the slurm.conf-named logs and the daemons' stdout/stderr captures."""
    extra = sorted((cluster.workdir / "log").glob("*.out"))
    return "\n".join(_log_tail(log) for log in (*cluster.logs, *extra))


def _wait_ctld(cluster: SlurmCluster, daemons: Daemons) -> None:
    """Poll `scontrol ping` until slurmctld answers."""
    deadline = time.monotonic() + 30
    last = ""
    while time.monotonic() < deadline:
        _check_alive(cluster, daemons)
        proc = cluster.run(["scontrol", "ping"], timeout=15)
        last = proc.stdout + proc.stderr
        if proc.returncode == 0 and " is UP" in proc.stdout:
            return
        time.sleep(0.1)
    raise SlurmClusterError(
        f"slurmctld did not answer `scontrol ping` in 30s; last: {last.strip()}\n"
        + _startup_logs(cluster)
    )


def _wait_nodes_idle(cluster: SlurmCluster, daemons: Daemons) -> None:
    """Poll `sinfo` until every node is registered and idle."""
    deadline = time.monotonic() + 60
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        _check_alive(cluster, daemons)
        proc = cluster.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=15)
        states = dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)
        if all(states.get(node) == "idle" for node in cluster.nodes):
            return
        time.sleep(0.1)
    raise SlurmClusterError(f"nodes not idle after 60s: {states}\n" + _startup_logs(cluster))


def _cancel_all_jobs(cluster: SlurmCluster) -> None:
    """Cancel leftover jobs and give them a moment to finish, so no step outlives the test."""
    try:
        cluster.run(["scancel", "--full", f"--partition={cluster.partition}"], timeout=15)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            proc = cluster.run(["squeue", "-h", "-o", "%i"], timeout=15)
            if proc.returncode != 0 or not proc.stdout.strip():
                return
            time.sleep(0.2)
    except subprocess.TimeoutExpired:
        pass


def _kill_strays(conf: Path, sessions: Sequence[int]) -> None:
    """SIGKILL what outlived the daemons: their session mates, and any process whose
    environ names our slurm.conf (slurmstepd and job tasks, which slurmd detaches)."""
    marker = f"SLURM_CONF={conf}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            ours = os.getsid(pid) in sessions or marker in (entry / "environ").read_bytes().split(
                b"\0"
            )
        except OSError:
            continue  # already gone, or a kernel thread
        if ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM a daemon, SIGKILL it after `timeout`, and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def _log_tail(path: Path, lines: int = 40) -> str:
    """Last `lines` lines of a log file, headed by its name, for error messages."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        return f"--- {path}: unreadable ({exc}) ---"
    return f"--- {path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])
