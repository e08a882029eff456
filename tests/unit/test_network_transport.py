"""Which network NCCL chose, from its INIT/NET log, and the absolute floor (pure).

The log lines are NCCL's own, as posted in public issue threads (host names as posted):
- Socket after a failed verbs load: NVIDIA/nccl#1410 (NCCL 2.x in a Kubernetes pod);
- RoCE over IB verbs: NVIDIA/nccl-tests#185 (NCCL 2.19.3, DGX H100);
- InfiniBand with 4 HCAs: siderolabs/docs#566 (the log the reporter expected);
- a net plugin: aws/aws-ofi-nccl#161 (aws-ofi-nccl 1.3.0, NCCL 2.10.3);
- HPC-X's RDMA plugin with SHARP: NVIDIA/nccl#1357 (H100 nodes, 4 HCAs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox.commands.doctor import own_net
from trainbox.network.transport import (
    NodeCount,
    Transport,
    floor,
    mixed,
    network_lines,
    parse,
    rated_gbps,
)
from trainbox.preflight.fabric import FabricFacts, Nic, RdmaPort

POD = "h100-kickoff-llama-70b-chat-20230328-bcf75c4f6-gn6nd"
SOCKET_LOG = f"""\
{POD}:2340:2384 [4] NCCL INFO Failed to open libibverbs.so[.1]
{POD}:2340:2384 [4] NCCL INFO NET/Socket : Using [0]eth0:10.177.137.15<0>
{POD}:2340:2384 [4] NCCL INFO Using non-device net plugin version 0
{POD}:2340:2384 [4] NCCL INFO Using network Socket
"""
ROCE_LOG = """\
dgxh100-4:460770:460770 [0] NCCL INFO Bootstrap : Using enp220s0np0:11.1.128.136<0>
dgxh100-4:460770:460770 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation
dgxh100-4:460770:460770 [0] NCCL INFO cudaDriverVersion 12000
NCCL version 2.19.3+cuda12.3
dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.136<0>
dgxh100-4:460770:460842 [0] NCCL INFO Using non-device net plugin version 0
dgxh100-4:460770:460842 [0] NCCL INFO Using network IB
"""
IB_LOG = """\
nccl-test:179:179 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [RO]; OOB eth0:10.0.0.1<0>
nccl-test:179:179 [0] NCCL INFO Using network IB
"""
PLUGIN_LOG = """\
algo-1:462:462 [0] NCCL INFO Bootstrap : Using eth0:10.200.5.135<0>
algo-1:462:462 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.
algo-1:462:462 [0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.3.0aws
algo-1:462:462 [0] NCCL INFO NET/OFI Selected Provider is efa
algo-1:462:462 [0] NCCL INFO Using network AWS Libfabric
"""


def test_a_fall_back_to_sockets_is_read_with_its_interface_and_reason() -> None:
    assert parse(SOCKET_LOG.splitlines()) == Transport(
        name="Socket", devices=("eth0",), notes=("Failed to open libibverbs.so[.1]",)
    )


def test_roce_over_verbs_is_ib_with_its_ports() -> None:
    found = parse(ROCE_LOG.splitlines())
    assert (found.name, found.devices, found.notes) == ("IB", ("mlx5_10:1", "mlx5_11:1"), ())


def test_infiniband_lists_every_hca_port() -> None:
    found = parse(IB_LOG.splitlines())
    assert found.devices == ("mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1")
    assert found.category == "IB"


IBEXT_LOG = """\
qh100-gpu19:49357:49418 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB/SHARP [1]mlx5_1:1/IB/SHARP [2]mlx5_4:1/IB/SHARP [3]mlx5_5:1/IB/SHARP [RO]; OOB ibp25s0:10.20.0.119<0>
qh100-gpu19:49357:49418 [3] NCCL INFO Using network IBext
"""


def test_hpcx_rdma_plugin_is_named_with_the_ib_ports_it_lists() -> None:
    found = parse(IBEXT_LOG.splitlines())
    assert (found.name, found.category) == ("IBext", "plugin")
    assert found.devices == ("mlx5_0:1", "mlx5_1:1", "mlx5_4:1", "mlx5_5:1")


def test_a_net_plugin_is_named_by_the_name_nccl_gives_it() -> None:
    found = parse(PLUGIN_LOG.splitlines())
    assert (found.name, found.category, found.devices) == ("AWS Libfabric", "plugin", ())


def test_a_log_without_a_network_line_says_nothing() -> None:
    assert parse(["NCCL version 2.29.7+cuda13.0", ""]).category == "none"


def test_the_last_communicator_decides() -> None:
    found = parse([*SOCKET_LOG.splitlines(), *IB_LOG.splitlines()])
    assert (found.name, found.devices[0]) == ("IB", "mlx5_0:1")


def test_only_the_network_lines_are_kept_for_the_record() -> None:
    kept = network_lines(ROCE_LOG.splitlines())
    assert [line.split(" NCCL INFO ")[1][:14] for line in kept] == [
        "NET/Plugin : d", "NET/IB : Using", "Using network ",
    ]  # fmt: skip


FABRIC = FabricFacts(
    ports=(
        RdmaPort(device="mlx5_10", port=1, state="ACTIVE", rate_gbps=400.0, link_layer="Ethernet"),
        RdmaPort(device="mlx5_11", port=1, state="ACTIVE", rate_gbps=200.0, link_layer="Ethernet"),
    ),
    nics=(Nic(name="eth0", speed_mbps=25000), Nic(name="lo", speed_mbps=None)),
)


def test_the_rated_speed_is_the_slowest_port_the_transport_uses() -> None:
    assert rated_gbps(parse(ROCE_LOG.splitlines()), FABRIC) == 200.0


def test_the_rated_speed_of_sockets_is_their_interface_speed() -> None:
    assert rated_gbps(parse(SOCKET_LOG.splitlines()), FABRIC) == 25.0


def test_hpcx_rdma_plugin_is_rated_by_its_ib_ports() -> None:
    ports = (RdmaPort(device="mlx5_4", port=1, state="ACTIVE", rate_gbps=400.0,
                      link_layer="InfiniBand"),)  # fmt: skip
    assert rated_gbps(parse(IBEXT_LOG.splitlines()), FabricFacts(ports=ports)) == 400.0


def test_a_plugin_or_an_unknown_device_has_no_rated_speed() -> None:
    assert rated_gbps(parse(PLUGIN_LOG.splitlines()), FABRIC) is None
    assert rated_gbps(Transport(name="Socket", devices=("lo",)), FABRIC) is None


def test_an_all_sockets_fabric_below_half_its_rated_speed_fails() -> None:
    # 25 Gb/s is 3.125 GB/s each way; sockets reached 1 GB/s.
    found = floor(1e9, 25.0, nics=1, lanes=1, min_fraction=0.5)
    assert (found.ok, found.floor) == (False, pytest.approx(1.5625e9))
    assert found.message == (
        "below the floor: reference link 1.00 GB/s against 50% of 25 Gb/s rated = 1.56 GB/s"
    )


def test_a_link_near_its_rated_speed_passes() -> None:
    assert floor(2.9e9, 25.0, nics=1, lanes=1, min_fraction=0.5).ok


def test_lanes_sharing_fewer_nics_expect_their_share() -> None:
    # 8 GPUs over 2 NICs of 400 Gb/s: each lane's link gets a quarter of one NIC.
    found = floor(10e9, 400.0, nics=2, lanes=8, min_fraction=0.5)
    assert found.floor == pytest.approx(0.5 * 50e9 / 4)
    assert found.ok
    assert "(8 lanes on 2 NIC(s))" in found.message


def test_without_a_rated_speed_there_is_no_floor() -> None:
    found = floor(1e6, None, nics=1, lanes=1, min_fraction=0.5)
    assert (found.ok, found.floor, found.message) == (True, None, "no rated NIC speed known")


def test_nodes_on_different_networks_are_named() -> None:
    counts = [NodeCount(name="IB", nodes=3, first_host="n1"),
              NodeCount(name="Socket", nodes=1, first_host="n4")]  # fmt: skip
    assert mixed(counts) == (
        "nodes use different networks: IB on 3 node(s), first n1; Socket on 1 node(s), first n4"
    )
    assert mixed(counts[:1]) is None


def test_a_rank_reads_its_own_nccl_log_and_the_rated_speed_of_the_nics_named(
    tmp_path: Path,
) -> None:
    (tmp_path / "nccl.2340.log").write_text(SOCKET_LOG)
    own = own_net(tmp_path, FABRIC, rated=None)
    assert (own.transport.name, own.rated_gbps, own.rated_given) == ("Socket", 25.0, False)
    assert own.lines[-1].endswith("NCCL INFO Using network Socket")


def test_a_rated_speed_given_by_hand_wins(tmp_path: Path) -> None:
    own = own_net(tmp_path, FABRIC, rated=400.0)
    assert (own.transport.category, own.rated_gbps, own.rated_given) == ("none", 400.0, True)
