"""Test host names (Slurm nodes, Kubeflow pods) that must resolve to this machine."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

HOSTS_FILE = Path("/etc/hosts")


def unresolved(names: Iterable[str]) -> list[str]:
    """The names that do not resolve yet."""
    return [
        name
        for name in names
        if subprocess.run(["getent", "hosts", name], capture_output=True, check=False).returncode
        != 0
    ]


def add_loopback(names: Iterable[str], *, why: str) -> None:
    """Make each name resolve to 127.0.0.1 by appending to /etc/hosts (root only); idempotent."""
    missing = unresolved(names)
    if missing:
        # Append in place: /etc/hosts is often a bind mount, which a rename would not update.
        with HOSTS_FILE.open("a", encoding="utf-8") as hosts:
            hosts.write(f"127.0.0.1 {' '.join(missing)}  # {why}\n")
