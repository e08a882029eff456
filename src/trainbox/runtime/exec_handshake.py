"""The exec handshake: before `trainbox exec` hands a job of several ranks to the user's
command, its ranks meet at the master.

Without this, a busy MASTER_PORT surfaced inside the script's own `init_process_group`: rank 0
crashed with EADDRINUSE deep in torch while the other ranks waited in silence for the script's
own timeout (30 minutes by default). Here rank 0 listens on MASTER_PORT first, which proves the
port free on the store's host (else preflight fails, exit 3), and every other rank says hello
and hears this job's answer. Once all have, rank 0 closes the port for the script's own store.

Plain sockets, not a TCPStore: a torch store client waits forever for a silent stranger on the
port, and importing torch would add a second to every rank's start. Each rank makes one short
connection and rank 0 holds none open: O(1) per rank, a few file descriptors on rank 0.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from collections.abc import Mapping

from trainbox.errors import DistributedError, PreflightError
from trainbox.launch.context import LaunchContext

# Variables that name one job of a launcher, so that another job answering on the same port
# is not mistaken for this one's master.
_JOB_IDS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")
# One hello or answer: a line of ASCII.
_MAX_LINE = 512
# Longest wait for one answer; a silent stranger on the port is retried until the deadline.
_ANSWER_S = 2.0
# First pause between connection attempts while rank 0 is not listening yet; it doubles.
_RETRY_S = 0.05
_MAX_RETRY_S = 1.0


def needed(context: LaunchContext) -> bool:
    """Whether this exec'd process is one rank of several whose store nobody hosts yet.

    torchrun's agent (and so node mode) already listens on MASTER_PORT, and a lone process has
    no peers to meet.
    """
    return context.world_size > 1 and not context.spawns_workers and context.launcher != "torchrun"


def job_tag(env: Mapping[str, str], context: LaunchContext) -> str:
    """What this job's ranks agree on without talking (ranks that disagree fail to meet)."""
    ids = [env[name] for name in _JOB_IDS if env.get(name)]
    return ":".join(["trainbox-exec", f"world={context.world_size}", *ids])


def meet(context: LaunchContext, *, tag: str, timeout_s: float) -> None:
    """Return once every rank has met rank 0; raise naming the master if that fails in time."""
    deadline = time.monotonic() + timeout_s
    if context.rank == 0:
        _host(context, tag=tag, deadline=deadline, timeout_s=timeout_s)
    else:
        _join(context, tag=tag, deadline=deadline, timeout_s=timeout_s)


def _where(context: LaunchContext) -> str:
    return f"{context.master_addr}:{context.master_port}"


def _host(context: LaunchContext, *, tag: str, deadline: float, timeout_s: float) -> None:
    with _listen(context) as server:
        met: set[int] = set()
        while len(met) < context.world_size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistributedError(
                    f"only {len(met) + 1} of {context.world_size} ranks reached the master"
                    f" {_where(context)} within {timeout_s:g} s",
                    hint="check that every rank started (scheduler logs) and can reach"
                    f" {_where(context)}; raise dist.timeout_s if ranks start slowly",
                )
            server.settimeout(left)
            with contextlib.suppress(TimeoutError):
                conn, _ = server.accept()
                with conn:
                    rank = _greet(conn, tag)
                    if rank is not None:
                        met.add(rank)


def _listen(context: LaunchContext) -> socket.socket:
    """Rank 0's listening socket on every address, as torch's store binds it."""
    port = context.master_port
    try:
        return _server(port)
    except OSError as err:
        taken = err.errno == errno.EADDRINUSE
        raise PreflightError(
            f"MASTER_PORT {port} is {'taken' if taken else 'unusable'} on rank 0's host"
            f" ({err.strerror}): the job's store cannot listen on {_where(context)}",
            hint=f"another job or a leftover process holds it (ss -ltnp 'sport = :{port}');"
            " pick another MASTER_PORT, or unset it to let trainbox derive one per job",
        ) from err


def _server(port: int) -> socket.socket:
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        except OSError as err:
            # A container may have IPv6 switched off; a taken port is taken for IPv4 too.
            if err.errno == errno.EADDRINUSE:
                raise
    return socket.create_server(("", port))


def _greet(conn: socket.socket, tag: str) -> int | None:
    """Read one rank's hello and answer it; the rank, or None for anything else."""
    conn.settimeout(_ANSWER_S)
    try:
        words = _read_line(conn).split()
        conn.sendall(f"{tag}\n".encode())
    except OSError:
        return None
    if len(words) != 2 or words[0] != tag or not words[1].isdigit():
        return None
    return int(words[1])


def _join(context: LaunchContext, *, tag: str, deadline: float, timeout_s: float) -> None:
    pause, heard = _RETRY_S, ""
    while time.monotonic() < deadline:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(
                (context.master_addr, context.master_port), timeout=min(left, _ANSWER_S)
            ) as conn:
                conn.sendall(f"{tag} {context.rank}\n".encode())
                heard = _read_line(conn)
            if heard == tag:
                return
        except OSError:
            pass  # not listening yet, or a stranger that says nothing
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(2 * pause, _MAX_RETRY_S)
    stranger = f" (something else answers there: {heard[:80]!r})" if heard else ""
    raise DistributedError(
        f"rank {context.rank} could not reach the master at {_where(context)} within"
        f" {timeout_s:g} s{stranger}",
        hint="look at rank 0's log first (a busy MASTER_PORT fails its preflight); check that"
        f" rank 0 runs on {context.master_addr}, that MASTER_ADDR/MASTER_PORT and the world"
        " size agree on every rank, and that no firewall blocks the port",
    )


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < _MAX_LINE:
        chunk = conn.recv(_MAX_LINE - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("ascii", "replace").strip()
