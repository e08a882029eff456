"""The fabric check: RDMA ports, NIC speeds, the verbs library and NCCL's knobs, read from a fake
sysfs tree and judged purely.

The file contents are as the kernel writes them: `state` is `4: ACTIVE` / `1: DOWN`, `rate` is
`100 Gb/sec (4X EDR)`, `link_layer` is `InfiniBand` or `Ethernet` (RoCE); the same fields as
`ibv_devinfo -v` prints them in NVIDIA/nccl#1866 and `ibstat` in NVIDIA/nccl#1591. A NIC that is
down answers its `speed` read with EINVAL, written here as a missing file.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trainbox.errors import PreflightError
from trainbox.preflight import Expectations, NodeFacts, Report, judge
from trainbox.preflight.fabric import (
    FabricFacts,
    RdmaPort,
    check_rdma_for_nccl,
    hca_allows,
    summary,
)
from trainbox.preflight.facts import GpuSurvey
from trainbox.preflight.node import read_fabric, verbs_error

# A GPU node with one active 200 Gb/s InfiniBand port (mlx5_0), a RoCE port whose link is down
# (mlx5_1), its Ethernet NIC, IPoIB and loopback.
IB_NODE = {
    "sys/class/infiniband/mlx5_0/ports/1/state": "4: ACTIVE\n",
    "sys/class/infiniband/mlx5_0/ports/1/rate": "200 Gb/sec (4X HDR)\n",
    "sys/class/infiniband/mlx5_0/ports/1/link_layer": "InfiniBand\n",
    "sys/class/infiniband/mlx5_1/ports/1/state": "1: DOWN\n",
    "sys/class/infiniband/mlx5_1/ports/1/rate": "40 Gb/sec (4X QDR)\n",
    "sys/class/infiniband/mlx5_1/ports/1/link_layer": "Ethernet\n",
    "sys/class/net/eth0/speed": "25000\n",
    "sys/class/net/ib0/speed": "200000\n",
    "sys/class/net/lo/addr_len": "6\n",
    "dev/infiniband/uverbs0": "",
    "dev/infiniband/rdma_cm": "",
}
# A cloud VM: Ethernet only, no RDMA device at all.
ETHERNET_NODE = {"sys/class/net/ens5/speed": "100000\n", "sys/class/net/lo/addr_len": "6\n"}
# The same RoCE port, down, with nothing else.
ROCE_DOWN_NODE = {k: v for k, v in IB_NODE.items() if "mlx5_1" in k or k.startswith("dev/")}


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def facts(
    root: Path, files: dict[str, str], *, verbs: str | None = None, **env: str
) -> FabricFacts:
    found = read_fabric(env, root=tree(root, files))
    # Whether this machine has libibverbs is not the test's business: say it outright.
    return FabricFacts(
        ports=found.ports, nics=found.nics, verbs_error=verbs,
        uverbs_devices=found.uverbs_devices, nccl_env=found.nccl_env,
    )  # fmt: skip


def test_ports_are_read_with_state_rate_and_link_layer(tmp_path: Path) -> None:
    found = read_fabric({}, root=tree(tmp_path, IB_NODE))
    assert found.ports == (
        RdmaPort(device="mlx5_0", port=1, state="ACTIVE", rate_gbps=200.0, link_layer="InfiniBand"),
        RdmaPort(device="mlx5_1", port=1, state="DOWN", rate_gbps=40.0, link_layer="Ethernet"),
    )
    assert found.uverbs_devices is True


def test_nic_speeds_are_read_in_mbps_and_an_unreadable_one_is_unknown(tmp_path: Path) -> None:
    found = read_fabric({}, root=tree(tmp_path, IB_NODE))
    assert {nic.name: nic.speed_mbps for nic in found.nics} == {
        "eth0": 25000, "ib0": 200000, "lo": None,
    }  # fmt: skip


def test_a_speed_of_minus_one_is_unknown(tmp_path: Path) -> None:
    found = read_fabric({}, root=tree(tmp_path, {"sys/class/net/eth1/speed": "-1\n"}))
    assert found.nics[0].speed_mbps is None


def test_a_node_without_sysfs_has_no_ports_and_no_nics(tmp_path: Path) -> None:
    found = read_fabric({}, root=tmp_path)
    assert (found.ports, found.nics, found.uverbs_devices) == ((), (), False)


def test_only_the_nccl_transport_knobs_are_recorded(tmp_path: Path) -> None:
    env = {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "^lo,docker"}
    found = read_fabric(env, root=tmp_path)
    assert found.nccl_env == (("NCCL_IB_HCA", "=mlx5_0:1"), ("NCCL_SOCKET_IFNAME", "^lo,docker"))


def test_a_library_that_does_not_exist_cannot_be_loaded() -> None:
    assert "libtrainbox-no-such" in (verbs_error("libtrainbox-no-such.so.9") or "")


def test_an_active_ib_port_nccl_can_use_is_ok(tmp_path: Path) -> None:
    found = check_rdma_for_nccl(facts(tmp_path, IB_NODE), nccl=True, num_nodes=2)
    assert found.status == "ok"
    assert found.message == "NCCL can use mlx5_0:1 IB 200 Gb/s; 1 port(s) not active"


def test_a_roce_port_that_is_down_leaves_sockets_and_is_no_finding(tmp_path: Path) -> None:
    found = check_rdma_for_nccl(
        facts(tmp_path, ROCE_DOWN_NODE, verbs="gone"), nccl=True, num_nodes=4
    )
    assert found.status == "ok"
    assert found.message == "no active RDMA port: NCCL uses TCP sockets; 1 port(s) not active"


def test_an_ethernet_node_without_rdma_is_ok(tmp_path: Path) -> None:
    found = check_rdma_for_nccl(
        facts(tmp_path, ETHERNET_NODE, verbs="gone"), nccl=True, num_nodes=4
    )
    assert (found.status, found.message) == ("ok", "no active RDMA port: NCCL uses TCP sockets")


def test_a_missing_verbs_library_fails_a_multi_node_job_naming_the_reason(tmp_path: Path) -> None:
    missing = "libibverbs.so.1: cannot open shared object file: No such file or directory"
    found = check_rdma_for_nccl(facts(tmp_path, IB_NODE, verbs=missing), nccl=True, num_nodes=2)
    assert found.status == "fail"
    assert found.message == (
        "NCCL would fall back to TCP sockets over 1 active RDMA port(s) (mlx5_0:1 IB 200 Gb/s):"
        f" libibverbs.so.1 cannot be loaded ({missing})"
    )
    assert "libibverbs1" in found.hint


def test_on_one_node_the_same_finding_only_warns(tmp_path: Path) -> None:
    found = check_rdma_for_nccl(facts(tmp_path, IB_NODE, verbs="gone"), nccl=True, num_nodes=1)
    assert found.status == "warn"
    assert found.message.endswith("(one node: only traffic between nodes would suffer)")


def test_a_container_without_dev_infiniband_is_named(tmp_path: Path) -> None:
    files = {k: v for k, v in IB_NODE.items() if not k.startswith("dev/")}
    found = check_rdma_for_nccl(facts(tmp_path, files), nccl=True, num_nodes=2)
    assert found.status == "fail"
    assert "no /dev/infiniband/uverbs* device in this container" in found.message
    assert "--device /dev/infiniband" in found.hint


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"NCCL_IB_DISABLE": "1"}, "NCCL_IB_DISABLE=1 turns InfiniBand off"),
        ({"NCCL_NET": "Socket"}, "NCCL_NET=Socket asks for TCP sockets"),
        ({"NCCL_IB_HCA": "=mlx5_1"}, "NCCL_IB_HCA==mlx5_1 names no active port"),
        ({"NCCL_IB_HCA": "^mlx5_0"}, "NCCL_IB_HCA=^mlx5_0 names no active port"),
    ],
)
def test_a_knob_that_turns_rdma_off_is_named(
    tmp_path: Path, env: dict[str, str], reason: str
) -> None:
    found = check_rdma_for_nccl(facts(tmp_path, IB_NODE, **env), nccl=True, num_nodes=2)
    assert found.status == "fail"
    assert found.message.endswith(f": {reason}")


def test_every_reason_is_named_at_once(tmp_path: Path) -> None:
    found = check_rdma_for_nccl(
        facts(tmp_path, IB_NODE, verbs="gone", NCCL_IB_DISABLE="1"), nccl=True, num_nodes=2
    )
    assert (
        "NCCL_IB_DISABLE=1 turns InfiniBand off; libibverbs.so.1 cannot be loaded" in found.message
    )


def test_a_net_plugin_chosen_on_purpose_is_no_finding(tmp_path: Path) -> None:
    found = check_rdma_for_nccl(
        facts(tmp_path, IB_NODE, verbs="gone", NCCL_NET="AWS Libfabric"), nccl=True, num_nodes=2
    )
    assert found.status == "ok"


def test_without_nccl_the_check_is_skipped_but_says_what_it_saw(tmp_path: Path) -> None:
    found = check_rdma_for_nccl(facts(tmp_path, IB_NODE, verbs="gone"), nccl=False, num_nodes=2)
    assert found.status == "skip"
    assert "1 active IB port(s) 200 Gb/s, unusable by NCCL" in found.message


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ("mlx5", True),  # a prefix
        ("mlx5_0", True),
        ("=mlx5", False),  # exact names only
        ("=mlx5_0:1", True),
        ("mlx5_0:2", False),  # another port
        ("^mlx5_1", True),
        ("^=mlx5_0", False),
        ("mlx5_1,mlx5_0:1", True),
    ],
)
def test_nccl_ib_hca_syntax(spec: str, allowed: bool) -> None:
    port = RdmaPort(
        device="mlx5_0", port=1, state="ACTIVE", rate_gbps=200.0, link_layer="InfiniBand"
    )
    assert hca_allows(spec, port) is allowed


def test_the_summary_differs_between_an_rdma_node_and_a_socket_node(tmp_path: Path) -> None:
    rdma = summary(facts(tmp_path / "a", IB_NODE))
    broken = summary(facts(tmp_path / "b", IB_NODE, verbs="gone"))
    plain = summary(facts(tmp_path / "c", ETHERNET_NODE))
    assert (rdma, broken, plain) == (
        "1 active IB port(s) 200 Gb/s",
        "1 active IB port(s) 200 Gb/s, unusable by NCCL",
        "no active RDMA port",
    )


NODE = NodeFacts(torch_cuda=(12, 8), shm_mib=65536, run_dir_problem=None, disk_free_mib=10**5,
                 master_problem=None)  # fmt: skip
WANT = Expectations(
    gpus="auto", gpus_needed=0, own_gpu=None, world_size=16, num_workers=0, local_world_size=8,
    shm_mib_per_worker=256, min_free_disk_mib=1024, other_process_share=0.1, nccl=True,
    num_nodes=2,
)  # fmt: skip


def test_preflight_adds_the_fabric_check_when_the_facts_were_read(tmp_path: Path) -> None:
    node = replace(NODE, fabric=facts(tmp_path, IB_NODE, verbs="gone"))
    checks = {c.name: c for c in judge(GpuSurvey(driver_error="none"), node, WANT)}
    assert checks["fabric"].status == "fail"
    assert "fabric" not in {c.name for c in judge(GpuSurvey(driver_error="none"), NODE, WANT)}


def test_the_fabric_check_is_fatal_only_when_listed(tmp_path: Path) -> None:
    node = replace(NODE, fabric=facts(tmp_path, IB_NODE, verbs="gone"))
    checks = judge(GpuSurvey(driver_error="none"), node, WANT)
    Report(checks=checks, fatal_names=frozenset()).raise_if_fatal()
    shown = Report(checks=checks, fatal_names=frozenset()).describe()
    assert [c["status"] for c in shown if c["name"] == "fabric"] == ["warn"]
    with pytest.raises(PreflightError, match="fabric: NCCL would fall back to TCP sockets"):
        Report(checks=checks, fatal_names=frozenset({"fabric"})).raise_if_fatal()
