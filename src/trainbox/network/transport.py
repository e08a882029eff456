"""Which network NCCL chose, read from its own INIT/NET log, and the absolute floor (pure).

The ring's verdict compares links with each other, so a job where every node fell back to TCP
sockets looks healthy. Two things catch that: the transport NCCL names in its log (`Using
network IB`, `Using network Socket`, or a plugin's name), and a floor from the rated speed of
the NICs that transport uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainbox.network.verdict import format_rate
from trainbox.preflight.fabric import FabricFacts

# What doctor --network sets for NCCL in its own processes, so each rank's log can be read back.
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
# The node-level transports, as counted across the job; a plugin's own name is carried beside.
CATEGORIES = ("IB", "Socket", "plugin", "none")
HINT = (
    "NCCL is not using the fabric's RDMA: run the CUDA image (it carries the verbs userspace),"
    " give the container /dev/infiniband, unset NCCL_IB_DISABLE or NCCL_NET=Socket, and check"
    " `trainbox doctor`'s fabric line; --network-rated-gbps sets the rated speed by hand"
)
HINT_MIXED = (
    "every node must use the same network: run the same image everywhere and compare the"
    " fabric line of `trainbox doctor` on the nodes named"
)

_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$")
_NET_USING = re.compile(r"NCCL INFO NET/(?P<net>IB|Socket)\s*: Using (?P<devices>.*)$")
_DEVICE = re.compile(r"\[\d+\](?P<name>\S+)")
_NOTES = (
    re.compile(r"NCCL (?:INFO|WARN) (?P<note>Failed to open libibverbs\.so\S*)"),
    re.compile(r"NCCL (?:INFO|WARN) (?P<note>NET/IB : No device found\.?)"),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Transport:
    """What one rank's NCCL log says about its network."""

    # `IB`, `Socket`, a plugin's name (`AWS Libfabric`), or "" when the log says nothing.
    name: str
    # The devices the chosen transport lists: `mlx5_0:1` ports for IB, interfaces for Socket.
    devices: tuple[str, ...] = ()
    # Lines that say why IB was not used (`Failed to open libibverbs.so[.1]`).
    notes: tuple[str, ...] = ()

    @property
    def category(self) -> str:
        """One of CATEGORIES."""
        if self.name in ("IB", "Socket"):
            return self.name
        return "plugin" if self.name else "none"


def parse(lines: Iterable[str]) -> Transport:
    """The transport of the last communicator NCCL set up in this log, with its devices."""
    name = ""
    devices: dict[str, tuple[str, ...]] = {}
    notes: list[str] = []
    for line in lines:
        if found := _USING_NETWORK.search(line):
            name = found["name"]
        elif found := _NET_USING.search(line):
            listed = found["devices"].split(";", 1)[0]
            devices[found["net"]] = tuple(_device(m["name"]) for m in _DEVICE.finditer(listed))
        else:
            for pattern in _NOTES:
                if note := pattern.search(line):
                    notes.append(note["note"])
    # HPC-X's RDMA plugin names itself IBext (IBext_v8, ...) and lists its ports as NET/IB does.
    used = devices.get("IB", ()) if _is_ibext(name) else devices.get(name, ())
    return Transport(name=name, devices=used, notes=tuple(dict.fromkeys(notes)))


def _is_ibext(name: str) -> bool:
    return name.startswith("IBext")


def network_lines(lines: Iterable[str], *, most: int = 40) -> list[str]:
    """The lines that say which network NCCL tried and chose, at most `most` of them."""
    wanted = [line for line in lines if "NCCL" in line and ("NET/" in line or "network" in line)]
    return wanted[:most]


def _device(entry: str) -> str:
    """`mlx5_0:1/IB` -> `mlx5_0:1`; `eth0:10.0.0.1<0>` -> `eth0`."""
    if "/" in entry:
        return entry.split("/", 1)[0]
    return entry.split(":", 1)[0]


def rated_gbps(transport: Transport, fabric: FabricFacts) -> float | None:
    """The slowest rated speed, Gbit/s, of the devices `transport` uses; None when unknown."""
    speeds: list[float] = []
    if transport.name == "IB" or _is_ibext(transport.name):
        rates = {port.name: port.rate_gbps for port in fabric.ports}
        speeds = [r for r in (rates.get(d) for d in transport.devices) if r is not None]
    elif transport.name == "Socket":
        nics = {nic.name: nic.speed_mbps for nic in fabric.nics}
        speeds = [s / 1000 for s in (nics.get(d) for d in transport.devices) if s is not None]
    return min(speeds) if speeds else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Floor:
    """The reference link against what the NICs are rated for."""

    # Slowest rated speed, Gbit/s, of the NICs the transport uses on any node; None: unknown.
    rated_gbps: float | None
    # Bytes per second a link must reach each way; None when there is no rated speed or link.
    floor: float | None
    # Whether the reference link reaches the floor (True when there is nothing to compare).
    ok: bool
    # One line for a person.
    message: str


def floor(
    reference: float | None,
    rated: float | None,
    *,
    nics: int,
    lanes: int,
    min_fraction: float,
) -> Floor:
    """The reference link (bytes/s each way) below `min_fraction` of its share of the rated
    speed fails. `lanes` links leave each node at once over its `nics` NICs, so a lane's
    share of one NIC is min(nics, lanes) / lanes of it."""
    if rated is None:
        return Floor(rated_gbps=None, floor=None, ok=True, message="no rated NIC speed known")
    share = min(max(nics, 1), lanes) / lanes
    needed = min_fraction * rated * 1e9 / 8 * share
    if reference is None:
        return Floor(
            rated_gbps=rated, floor=needed, ok=True, message="no link to hold against the floor"
        )
    lane_text = f" ({lanes} lanes on {nics} NIC(s))" if share < 1 else ""
    text = (
        f"reference link {format_rate(reference)} against {min_fraction:.0%} of"
        f" {rated:g} Gb/s rated{lane_text} = {format_rate(needed)}"
    )
    if reference < needed:
        return Floor(rated_gbps=rated, floor=needed, ok=False, message=f"below the floor: {text}")
    return Floor(rated_gbps=rated, floor=needed, ok=True, message=f"above the floor: {text}")


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeCount:
    """How many nodes use one transport, and the first of them by rank."""

    # `IB`, `Socket`, the plugin's name, or `none` (gloo, or NCCL logged nothing).
    name: str
    # Nodes using it.
    nodes: int
    # Host name of the node with the lowest rank using it.
    first_host: str


def mixed(counts: Sequence[NodeCount]) -> str | None:
    """A line naming the nodes' differing transports; None when all nodes agree."""
    if len(counts) < 2:
        return None
    parts = "; ".join(f"{c.name} on {c.nodes} node(s), first {c.first_host}" for c in counts)
    return f"nodes use different networks: {parts}"


def describe(counts: Sequence[NodeCount]) -> str:
    """`IB on 4 node(s)` or both kinds, for the table."""
    return "; ".join(f"{c.name} on {c.nodes} node(s)" for c in counts) or "unknown"
