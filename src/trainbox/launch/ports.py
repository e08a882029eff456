"""MASTER_PORT when nobody gave one: agreed by every rank without talking to each other."""

from __future__ import annotations

import socket
import zlib

# Ports handed out by derivation: below Linux's ephemeral range (32768+) so a port picked here
# never collides with a client socket the kernel chose, and above common service ports.
DERIVED_PORT_BASE = 20000
DERIVED_PORT_SPAN = 10000

# torch's own default, used when there is no job identity to derive from.
DEFAULT_PORT = 29500


def derived_port(*identity: str) -> int:
    """A port in [20000, 30000) from a job's identity (job and step id), equal on every rank."""
    digest = zlib.crc32("/".join(identity).encode())
    return DERIVED_PORT_BASE + digest % DERIVED_PORT_SPAN


def first_reserved_port(resv_ports: str) -> int:
    """The first port of SLURM_STEP_RESV_PORTS (`12000-12003` or `12000,12005`)."""
    head = resv_ports.split(",")[0].split("-")[0].strip()
    if not (head.isascii() and head.isdigit()) or not 0 < int(head) < 65536:
        raise ValueError(f"{resv_ports!r} is not a Slurm port list")
    return int(head)


def free_port(addr: str = "127.0.0.1") -> int:
    """A port nobody listens on right now, as the kernel picks it (torchrun --standalone's way)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return int(sock.getsockname()[1])
