"""Which exec'd processes meet at the master first, and what their job agrees on."""

from __future__ import annotations

import dataclasses
import errno
import socket

import pytest

from trainbox.errors import PreflightError
from trainbox.launch import HostFacts, detect
from trainbox.runtime import exec_handshake

from launchcase import srun_task

TASK = srun_task(procid=1, localid=1, nodeid=0, tasks=2, nodes=1, tasks_per_node="2", nodelist="n1")
CONTEXT = detect(TASK, HostFacts())


@pytest.mark.parametrize(
    ("change", "needed"),
    [
        ({}, True),
        ({"world_size": 1, "rank": 0, "local_world_size": 1, "local_rank": 0}, False),
        # torchrun's agent already listens on MASTER_PORT.
        ({"launcher": "torchrun"}, False),
        # Node mode: torchrun's agent meets the other nodes.
        ({"spawns_workers": True}, False),
    ],
)
def test_who_meets_before_the_command(change: dict[str, object], needed: bool) -> None:
    assert exec_handshake.needed(dataclasses.replace(CONTEXT, **change)) is needed  # type: ignore[arg-type]


def test_the_job_tag_names_the_slurm_step_and_the_world() -> None:
    assert exec_handshake.job_tag(TASK, CONTEXT) == "trainbox-exec:world=2:9:0"


def test_ranks_that_disagree_on_the_world_have_different_tags() -> None:
    other = dataclasses.replace(CONTEXT, world_size=4)
    assert exec_handshake.job_tag(TASK, other) != exec_handshake.job_tag(TASK, CONTEXT)


def test_without_ipv6_rank_0_listens_on_ipv4(monkeypatch: pytest.MonkeyPatch) -> None:
    # A container with IPv6 switched off refuses AF_INET6 sockets: that is no taken port.
    real = socket.create_server
    families: list[object] = []

    def create_server(address: tuple[str, int], **options: object) -> socket.socket:
        families.append(options.get("family", socket.AF_INET))
        if options.get("family") == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(("127.0.0.1", address[1]))

    monkeypatch.setattr(socket, "has_dualstack_ipv6", lambda: True)
    monkeypatch.setattr(socket, "create_server", create_server)
    with exec_handshake._server(0) as server:
        assert server.family == socket.AF_INET
    assert families == [socket.AF_INET6, socket.AF_INET]


def test_a_port_rank_0_may_not_use_is_a_preflight_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_port: int) -> socket.socket:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(exec_handshake, "_server", refuse)
    master = dataclasses.replace(CONTEXT, rank=0, master_port=80)
    with pytest.raises(
        PreflightError, match=r"MASTER_PORT 80 is unusable on rank 0's host \(Permission denied\)"
    ):
        exec_handshake.meet(master, tag="t", timeout_s=1)
