"""The node's network fabric as NCCL will meet it, and whether NCCL can use its RDMA ports (pure).

NCCL picks its transport at init on its own: with no usable verbs library, no /dev/infiniband in
the container, or a knob that turns InfiniBand off, it logs one INFO line and runs over TCP
sockets, several times slower and with no error. These facts let preflight say so first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The NCCL variables that decide which transport NCCL picks and over which devices.
NCCL_KNOBS = ("NCCL_IB_DISABLE", "NCCL_NET", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_NET_PLUGIN")
VERBS_LIBRARY = "libibverbs.so.1"
HINT_VERBS = (
    "run the trainbox CUDA image (it carries Debian's libibverbs1 and ibverbs-providers) or"
    " install rdma-core's userspace"
)
HINT_DEVICES = (
    "give the container the RDMA devices: docker/podman --device /dev/infiniband, apptainer"
    " without --containall (or --bind /dev/infiniband), a Kubernetes RDMA device plugin"
)
HINT_KNOBS = "unset the NCCL variable named, unless sockets are what you want"


@dataclass(frozen=True, kw_only=True, slots=True)
class RdmaPort:
    """One port of an RDMA device, as /sys/class/infiniband/<device>/ports/<port>/ says."""

    # Device name, e.g. `mlx5_0`.
    device: str
    # Port number (1-based).
    port: int
    # The state word, e.g. `ACTIVE`, `DOWN` (the file says `4: ACTIVE`).
    state: str
    # Rated speed in Gbit/s (`200 Gb/sec (4X HDR)`); None when unreadable.
    rate_gbps: float | None
    # `InfiniBand`, or `Ethernet` for RoCE.
    link_layer: str

    @property
    def active(self) -> bool:
        """Whether the port can carry traffic now."""
        return self.state == "ACTIVE"

    @property
    def name(self) -> str:
        """`mlx5_0:1`, as NCCL_IB_HCA and NCCL's log name a port."""
        return f"{self.device}:{self.port}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Nic:
    """One network interface, as /sys/class/net/<name>/speed says."""

    # Interface name, e.g. `eth0`, `ib0`.
    name: str
    # Rated speed in Mbit/s; None when the kernel gives none (down, loopback, most virtual NICs).
    speed_mbps: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class FabricFacts:
    """What this node offers NCCL, read once per process."""

    # Every RDMA port under /sys/class/infiniband, in name order.
    ports: tuple[RdmaPort, ...] = ()
    # Every interface under /sys/class/net, in name order.
    nics: tuple[Nic, ...] = ()
    # Why dlopen(libibverbs.so.1) failed in this process; None when it loaded.
    verbs_error: str | None = None
    # Whether /dev/infiniband holds a uverbs device (a container may not have been given it).
    uverbs_devices: bool = False
    # The NCCL_KNOBS that are set, with their values.
    nccl_env: tuple[tuple[str, str], ...] = ()


def knobs(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The NCCL transport variables set in `env`."""
    return tuple((name, env[name]) for name in NCCL_KNOBS if name in env)


def parse_state(text: str) -> str:
    """`4: ACTIVE` -> `ACTIVE`."""
    return text.strip().rpartition(":")[2].strip()


def parse_rate(text: str) -> float | None:
    """`200 Gb/sec (4X HDR)` -> 200.0; None when there is no number."""
    word = text.strip().split(" ", 1)[0]
    try:
        return float(word)
    except ValueError:
        return None


def parse_speed(text: str) -> int | None:
    """/sys/class/net/*/speed in Mbit/s; the kernel writes -1 (or 4294967295) for unknown."""
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if 0 < value < 2**31 - 1 else None


def hca_allows(spec: str, port: RdmaPort) -> bool:
    """Whether NCCL_IB_HCA=`spec` lets NCCL use `port`.

    NCCL's syntax: a leading `^` excludes the listed devices, a leading `=` (after any `^`)
    matches names exactly instead of as prefixes, and `name:port` narrows an entry to one port.
    """
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    spec = spec.removeprefix("=")
    listed = False
    for entry in filter(None, (item.strip() for item in spec.split(","))):
        device, _, port_text = entry.partition(":")
        name_ok = port.device == device if exact else port.device.startswith(device)
        port_ok = not port_text or port_text == str(port.port)
        listed = listed or (name_ok and port_ok)
    return listed != exclude


def usable_ports(facts: FabricFacts) -> tuple[RdmaPort, ...]:
    """The active ports NCCL_IB_HCA leaves to NCCL."""
    spec = dict(facts.nccl_env).get("NCCL_IB_HCA")
    return tuple(p for p in facts.ports if p.active and (not spec or hca_allows(spec, p)))


def blockers(facts: FabricFacts) -> list[tuple[str, str]]:
    """Why NCCL cannot use this node's active RDMA ports, each with what to do; [] when it can
    (or when there is no active port: then sockets are all there is)."""
    if not any(p.active for p in facts.ports):
        return []
    env = dict(facts.nccl_env)
    found: list[tuple[str, str]] = []
    net = env.get("NCCL_NET", "").strip()
    if net and net.lower() not in ("ib", "socket"):
        # A net plugin (aws-ofi-nccl, ...) was chosen on purpose; it brings its own needs.
        return []
    if net.lower() == "socket":
        found.append((f"NCCL_NET={net} asks for TCP sockets", HINT_KNOBS))
    if env.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
        found.append((f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']} turns InfiniBand off", HINT_KNOBS))
    if facts.verbs_error is not None:
        found.append((f"{VERBS_LIBRARY} cannot be loaded ({facts.verbs_error})", HINT_VERBS))
    if not facts.uverbs_devices:
        found.append(("no /dev/infiniband/uverbs* device in this container", HINT_DEVICES))
    if "NCCL_IB_HCA" in env and not usable_ports(facts):
        found.append((
            f"NCCL_IB_HCA={env['NCCL_IB_HCA']} names no active port",
            "set NCCL_IB_HCA to active ports (ibstat lists them) or unset it",
        ))  # fmt: skip
    return found


def _ports_text(ports: tuple[RdmaPort, ...]) -> str:
    return ", ".join(f"{p.name} {_layer(p)} {_gbps(p.rate_gbps)}" for p in ports)


def _layer(port: RdmaPort) -> str:
    return "RoCE" if port.link_layer.lower() == "ethernet" else "IB"


def _gbps(rate: float | None) -> str:
    return "? Gb/s" if rate is None else f"{rate:g} Gb/s"


def summary(facts: FabricFacts) -> str:
    """One short line that should read the same on every node of a job: how many active RDMA
    ports of which kind and slowest rate, and whether NCCL can use them."""
    active = [p for p in facts.ports if p.active]
    if not active:
        return "no active RDMA port"
    layers = "+".join(sorted({_layer(p) for p in active}))
    rates = [p.rate_gbps for p in active if p.rate_gbps is not None]
    slowest = f" {min(rates):g} Gb/s" if rates else ""
    line = f"{len(active)} active {layers} port(s){slowest}"
    reasons = blockers(facts)
    return f"{line}, unusable by NCCL" if reasons else line


@dataclass(frozen=True, kw_only=True, slots=True)
class FabricVerdict:
    """What the fabric check says."""

    # ok, warn, fail or skip (as preflight's Check).
    status: str
    # One line naming the ports and why NCCL cannot use them.
    message: str
    # What to do, for a warn or fail.
    hint: str = ""


def check_rdma_for_nccl(facts: FabricFacts, *, nccl: bool, num_nodes: int) -> FabricVerdict:
    """Active RDMA ports, GPUs and NCCL, but NCCL cannot use the ports: a finding.

    It fails (fatal only where preflight.fatal lists `fabric`) for a job of several nodes, and
    only warns on one node, where NCCL keeps its traffic inside the node anyway.
    """
    active = tuple(p for p in facts.ports if p.active)
    down = len(facts.ports) - len(active)
    resting = f"; {down} port(s) not active" if down else ""
    if not nccl:
        return FabricVerdict(
            status="skip", message=f"no NCCL here (CPU or gloo); {summary(facts)}{resting}"
        )
    if not active:
        return FabricVerdict(
            status="ok", message=f"no active RDMA port: NCCL uses TCP sockets{resting}"
        )
    reasons = blockers(facts)
    if not reasons:
        used = usable_ports(facts) or active
        return FabricVerdict(status="ok", message=f"NCCL can use {_ports_text(used)}{resting}")
    why = "; ".join(reason for reason, _ in reasons)
    scope = "" if num_nodes > 1 else " (one node: only traffic between nodes would suffer)"
    return FabricVerdict(
        status="fail" if num_nodes > 1 else "warn",
        message=f"NCCL would fall back to TCP sockets over {len(active)} active RDMA port(s)"
        f" ({_ports_text(active)}): {why}{scope}",
        hint="; ".join(dict.fromkeys(hint for _, hint in reasons)),
    )


def describe(facts: FabricFacts) -> dict[str, object]:
    """Plain data for doctor's JSON."""
    return {
        "rdma_ports": [
            {
                "name": p.name,
                "state": p.state,
                "rate_gbps": p.rate_gbps,
                "link_layer": p.link_layer,
            }
            for p in facts.ports
        ],
        "nics": {nic.name: nic.speed_mbps for nic in facts.nics},
        "verbs": "loaded" if facts.verbs_error is None else facts.verbs_error,
        "uverbs_devices": facts.uverbs_devices,
        "nccl_env": dict(facts.nccl_env),
        "summary": summary(facts),
    }
