"""The store client the watchdog talks through, and what a failed collective said."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from trainbox.errors import DistributedError

# What gloo and NCCL say when a peer is gone or a collective timed out (they raise plain
# RuntimeError from inside DDP's backward, not torch.distributed.DistError).
_COMM_FAILURES = (
    "gloo",
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
    "NCCL",
    "Broken pipe",
    "caused pair closure",
)
# gloo's "[/path/to/pair.cc:553] " in front of what happened.
_SOURCE_PLACE = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")
# Longest failure text kept on the error line: the verdict is what the line is for.
SHORT_ERROR = 100
# Seconds one store request of the watchdog may wait once connected.
OP_TIMEOUT_S = 5.0
# Seconds its connect may take at least: when many ranks connect at once, a connect whose SYN
# overflowed the store's backlog is retried by the kernel after 1 s, 3 s, 7 s.
CONNECT_MIN_S = 30.0


def is_comm_failure(error: BaseException) -> bool:
    """Whether an exception from a training step is the transport failing, not user code."""
    import torch.distributed as torch_dist

    return isinstance(error, torch_dist.DistError) or (
        isinstance(error, RuntimeError) and any(s in str(error) for s in _COMM_FAILURES)
    )


def short_error(text: str) -> str:
    """A transport error's first sentence, without gloo's source place and advice."""
    line = text.strip().splitlines()[0] if text.strip() else "no message"
    line = _SOURCE_PLACE.sub("", line)
    # "Connection closed by peer [127.0.0.1]:4481. This is typically caused by ... GLHF!"
    line = re.split(r"\.\s", line, maxsplit=1)[0]
    return line if len(line) <= SHORT_ERROR else line[: SHORT_ERROR - 3] + "..."


def connect(addr: str, port: int, *, world_size: int, timeout_s: float, attempt: str) -> Any:
    """A store client of its own: connected with the job's timeout, then quick to give up.

    Connecting may take long on a busy store (every rank connects at once); once connected, a
    heartbeat must not block for long on a dead master. Keys are per round of the worker
    group (`attempt`): a dead worker's last beat must not speak for its successor.
    """
    import torch.distributed as torch_dist

    if world_size == 1:
        # No peers to hear it (and no master port: one process picks its own).
        return torch_dist.HashStore()
    try:
        client = torch_dist.TCPStore(
            addr,
            port,
            is_master=False,
            timeout=timedelta(seconds=max(timeout_s, CONNECT_MIN_S)),
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as err:
        raise DistributedError(
            f"the hang watchdog could not connect to the job's store at {addr}:{port}"
            f" ({short_error(str(err))})",
            hint="the process group reached it moments ago: check that host's load and network,"
            " or raise dist.timeout_s",
        ) from err
    client.set_timeout(timedelta(seconds=min(timeout_s, OP_TIMEOUT_S)))
    return torch_dist.PrefixStore(f"attempt-{attempt}", client)
