"""A TCP port nobody is listening on right now (tests never hard-code ports)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """Ask the kernel for a free port on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
