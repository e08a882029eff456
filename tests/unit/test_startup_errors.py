"""torch's rendezvous failures become one line naming the address, the port and what to check."""

from __future__ import annotations

import pytest

from trainbox.distributed.process_group import startup_error
from trainbox.launch import detect

RANK1 = detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29411"})


@pytest.mark.parametrize(
    ("torch_message", "expected"),
    [
        ("The client socket has timed out after 3000ms while trying to connect to (10.1.2.3, 29411).",
         "rank 1 could not reach the master at 10.1.2.3:29411 within 3 s"),
        ("Timed out after 4 seconds waiting for clients. 1/2 clients joined.",
         "only 1 of 2 ranks reached the master 10.1.2.3:29411 within 3 s"),
        ("The server socket has failed to listen on any local network address. port: 29411, useIpv6: false,"
         " code: -98, name: EADDRINUSE, message: address already in use",
         "rank 1: port 29411 is already in use on this host"),
        ("something else entirely", "rank 1 could not join the process group at 10.1.2.3:29411"),
    ],
    ids=["unreachable-master", "missing-peer", "port-in-use", "other"],
)  # fmt: skip
def test_startup_error(torch_message: str, expected: str) -> None:
    error = startup_error(RANK1, torch_message, timeout_s=3)
    assert error.exit_code == 4
    assert expected in error.line()
    assert "HINT: " in error.line()
