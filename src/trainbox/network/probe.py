"""The measurements: collective sweeps and the ring of neighbour links, on a joined group.

Every rank runs this. What reaches the other ranks is fixed in size whatever the world size
(docs/network-check.md, "What it costs at scale"): one time per collective and size, a
histogram for the yardstick, and the few slowest links with their names.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist

from trainbox.distributed.process_group import Session
from trainbox.network import bandwidth, ring, transport, verdict

# nccl-tests runs 5 warm-up and 20 timed calls; fewer here keep a 256 MiB sweep on CPUs short.
WARMUP = 2
TIMED = 5
# A link is timed with one exchange of this many bytes each way (capped by --network-max-bytes).
LINK_BYTES = 16 * 1024 * 1024
LINK_TIMED = 5
# The slowest links are listed with their names (all links, in a ring this small); the rest are
# only counted, so what each rank receives stays the same size at any scale.
WORST_NAMED = 8
# Room for "rank 4095 on <a 64-character host name>", UTF-8.
NAME_BYTES = 96
# An int64 key that sorts links by speed, then rank: KiB/s above, the owner's rank below.
RANK_BITS = 24
NOT_SLOW = torch.iinfo(torch.int64).max


@dataclass(frozen=True, kw_only=True, slots=True)
class Result:
    """What the network check found, the same on every rank."""

    # Ranks in the job.
    world_size: int
    # Process group backend (gloo or nccl) and the device the buffers lived on.
    backend: str
    device: str
    # The all-reduce sweep, smallest size first.
    sweep: tuple[bandwidth.SweepRow, ...]
    # The ring: positions, whether they are nodes, lanes, and bytes exchanged per link.
    ring_size: int
    ring_of_nodes: bool
    lanes: int
    link_bytes: int
    # The WORST_NAMED slowest links, slowest first.
    links: tuple[verdict.Link, ...]
    # The judgement.
    verdict: verdict.NetworkVerdict
    # The network NCCL chose, counted over nodes (each node's local rank 0), most nodes first.
    transports: tuple[transport.NodeCount, ...]
    # The reference link against the slowest rated NIC speed the transport uses.
    floor: transport.Floor
    # Rank 0's own NCCL INIT/NET lines about the network (the record; empty under gloo).
    nccl_lines: tuple[str, ...] = ()
    # The all-gather and reduce-scatter sweeps (size: the whole buffer), smallest size first.
    all_gather: tuple[bandwidth.SweepRow, ...] = ()
    reduce_scatter: tuple[bandwidth.SweepRow, ...] = ()

    @property
    def ok(self) -> bool:
        """No slow link, the floor held, and every node on the same network."""
        return self.verdict.ok and self.floor.ok and transport.mixed(self.transports) is None


@dataclass(frozen=True, kw_only=True, slots=True)
class OwnNet:
    """What this rank knows of its own network before measuring."""

    # What its NCCL log says (an empty name under gloo).
    transport: transport.Transport
    # Rated speed, Gbit/s, of the slowest NIC that transport uses here; None when unknown.
    rated_gbps: float | None
    # Whether the rated speed was given by hand (then the floor holds even on one node).
    rated_given: bool = False
    # NCCL's lines about the network, kept by rank 0 for the report.
    lines: tuple[str, ...] = ()


def check(
    session: Session, *, max_bytes: int, min_fraction: float, own: OwnNet | None = None
) -> Result:
    """Sweep, then time the ring's links, then judge them; every rank returns the same Result."""
    own = own or OwnNet(transport=transport.Transport(name=""), rated_gbps=None)
    device = session.device
    sizes = bandwidth.sweep_sizes(max_bytes)
    rows = sweeps(sizes, bandwidth.shard_sizes(sizes, session.context.world_size), device)
    context = session.context
    node_major = _all_true(
        ring.is_node_major(
            rank=context.rank,
            node_rank=context.node_rank,
            local_rank=context.local_rank,
            local_world_size=context.local_world_size,
        ),
        device,
    )
    seat = ring.seat(
        rank=context.rank,
        world_size=context.world_size,
        node_rank=context.node_rank,
        num_nodes=context.num_nodes,
        local_rank=context.local_rank,
        local_world_size=context.local_world_size,
        node_major=node_major,
    )
    link_bytes = min(LINK_BYTES, max_bytes)
    host = socket.gethostname()
    name = host if seat.of_nodes else f"rank {context.rank} on {host}"
    timed = time_links(seat, link_bytes, name, device)
    links, judged = _find_slow_links(seat, timed, context.rank, min_fraction, device)
    lanes = context.local_world_size if seat.of_nodes else 1
    counts = _node_transports(own.transport, context.local_rank == 0, name, device)
    rated, nics = _slowest_rated(own, device)
    if seat.of_nodes or own.rated_given:
        floor = transport.floor(
            judged.reference, rated, nics=nics, lanes=lanes, min_fraction=min_fraction
        )
    else:
        floor = transport.Floor(
            rated_gbps=rated, floor=None, ok=True, message="one node: no link crosses a NIC"
        )
    return Result(
        world_size=context.world_size,
        backend=session.backend,
        device=str(device),
        sweep=tuple(rows[bandwidth.ALL_REDUCE]),
        all_gather=tuple(rows[bandwidth.ALL_GATHER]),
        reduce_scatter=tuple(rows[bandwidth.REDUCE_SCATTER]),
        ring_size=seat.size,
        ring_of_nodes=seat.of_nodes,
        lanes=lanes,
        link_bytes=link_bytes,
        links=tuple(links),
        verdict=judged,
        transports=counts,
        floor=floor,
        nccl_lines=own.lines if context.rank == 0 else (),
    )


def _node_transports(
    own: transport.Transport, leader: bool, name: str, device: torch.device
) -> tuple[transport.NodeCount, ...]:
    """Nodes per transport and the first node of each, from each node's local rank 0.

    Fixed-size all-reduces: counts (SUM), the lowest rank per kind (MIN), then that rank's host
    name and plugin name (SUM, one writer per slot), whatever the number of nodes.
    """
    kinds = len(transport.CATEGORIES)
    rank = torch_dist.get_rank()
    index = transport.CATEGORIES.index(own.category)
    counts = torch.zeros(kinds, dtype=torch.int64, device=device)
    first = torch.full((kinds,), NOT_SLOW, dtype=torch.int64, device=device)
    if leader:
        counts[index] = 1
        first[index] = rank
    torch_dist.all_reduce(counts)
    torch_dist.all_reduce(first, op=torch_dist.ReduceOp.MIN)
    names = torch.zeros(kinds + 1, NAME_BYTES, dtype=torch.uint8, device=device)
    firsts = first.tolist()
    if leader and firsts[index] == rank:
        names[index] = _encode(name.removeprefix(f"rank {rank} on "), device)
        if own.category == "plugin":
            names[kinds] = _encode(own.name, device)
    torch_dist.all_reduce(names)
    plugin = _decode(names[kinds])
    found = [
        transport.NodeCount(
            name=plugin if kind == "plugin" else kind,
            nodes=int(count),
            first_host=_decode(names[i]),
        )
        for i, (kind, count) in enumerate(zip(transport.CATEGORIES, counts.tolist(), strict=True))
        if count
    ]
    return tuple(sorted(found, key=lambda c: -c.nodes))


def _slowest_rated(own: OwnNet, device: torch.device) -> tuple[float | None, int]:
    """The slowest rated speed over the job and the fewest NICs a node's transport uses."""
    unknown = float("inf")
    mine = torch.tensor(
        [own.rated_gbps if own.rated_gbps is not None else unknown,
         float(len(own.transport.devices) or 1)],
        dtype=torch.float64, device=device,
    )  # fmt: skip
    torch_dist.all_reduce(mine, op=torch_dist.ReduceOp.MIN)
    rated, nics = mine.tolist()
    return (None if rated == unknown else rated), int(nics)


def sweeps(
    sizes: list[int], shard_sizes: list[int], device: torch.device
) -> dict[str, list[bandwidth.SweepRow]]:
    """Time WARMUP + TIMED calls per collective and size: all-reduce over `sizes`, all-gather and
    reduce-scatter over `shard_sizes` (whole buffers, n shards each). One all-reduce MAX of every
    time then gives the slowest rank's.

    The slowest rank's time is the collective's time: nccl-tests reports it with `-a 3` (its
    default `-a 1` averages over ranks instead).
    """
    world_size = torch_dist.get_world_size()
    plan = [(bandwidth.ALL_REDUCE, size) for size in sizes] + [
        (collective, size)
        for collective in (bandwidth.ALL_GATHER, bandwidth.REDUCE_SCATTER)
        for size in shard_sizes
    ]
    times = torch.zeros(len(plan), dtype=torch.float64, device=device)
    for index, (collective, size) in enumerate(plan):
        times[index] = _seconds(collective, size, world_size, device)
    torch_dist.all_reduce(times, op=torch_dist.ReduceOp.MAX)
    slowest = times.tolist()
    rows: dict[str, list[bandwidth.SweepRow]] = {name: [] for name in bandwidth.COLLECTIVES}
    for index, (collective, size) in enumerate(plan):
        rows[collective].append(bandwidth.row(size, slowest[index], world_size, collective))
    return rows


def _seconds(collective: str, size: int, world_size: int, device: torch.device) -> float:
    """Mean seconds of one `collective` on a whole buffer of `size` bytes."""
    elements = size // bandwidth.ELEMENT_BYTES
    full = torch.ones(elements, dtype=torch.float32, device=device)
    if collective == bandwidth.ALL_REDUCE:
        return _timed(lambda: torch_dist.all_reduce(full), device, WARMUP, TIMED)
    # Every buffer is at most `size` bytes: the gathered output or the input to scatter is the
    # whole S, each rank's shard S / n. gloo runs both *_tensor forms on CPU (torch 2.13).
    shard = torch.ones(elements // world_size, dtype=torch.float32, device=device)
    gather = collective == bandwidth.ALL_GATHER

    def call() -> object:
        if gather:
            return torch_dist.all_gather_into_tensor(full, shard)
        return torch_dist.reduce_scatter_tensor(shard, full)

    return _timed(call, device, WARMUP, TIMED)


def _timed(call: Callable[[], object], device: torch.device, warmup: int, timed: int) -> float:
    """Mean seconds per call after `warmup` untimed calls (waiting for the GPU at both ends)."""
    for _ in range(warmup):
        call()
    _wait(device)
    start = time.perf_counter()
    for _ in range(timed):
        call()
    _wait(device)
    return (time.perf_counter() - start) / timed


def _wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Timed:
    """This rank's two link measurements, in bytes per second each way (None: no such link)."""

    out_bandwidth: float | None
    in_bandwidth: float | None
    # This rank's name in the ring, and its next peer's.
    own_name: str
    next_name: str


def time_links(seat: ring.RingSeat, nbytes: int, name: str, device: torch.device) -> _Timed:
    """Time this rank's outgoing and incoming links, one phase at a time, all ranks in step."""
    own_name = _encode(name, device)
    next_name = torch.zeros_like(own_name)
    out_bw = in_bw = None
    for phase in range(ring.PHASES):
        # The other phases' links stay quiet while these are timed.
        _barrier(device)
        if seat.next_rank is not None and seat.out_phase == phase:
            _exchange(seat.next_rank, own_name, next_name)
            out_bw = _link_bandwidth(seat.next_rank, nbytes, device)
        if seat.prev_rank is not None and seat.in_phase == phase:
            _exchange(seat.prev_rank, own_name, torch.zeros_like(own_name))
            in_bw = _link_bandwidth(seat.prev_rank, nbytes, device)
    _barrier(device)
    return _Timed(
        out_bandwidth=out_bw, in_bandwidth=in_bw, own_name=name, next_name=_decode(next_name)
    )


def _link_bandwidth(peer: int, nbytes: int, device: torch.device) -> float:
    """Bytes per second each way while this rank and `peer` send each other `nbytes` at once."""
    send = torch.ones(nbytes // bandwidth.ELEMENT_BYTES, dtype=torch.float32, device=device)
    receive = torch.empty_like(send)
    token = torch.zeros(1, device=device)
    echo = torch.empty_like(token)
    _exchange(peer, send, receive)  # warm-up: NCCL connects a pair on first use

    def once() -> float:
        # A one-element exchange first lines both ends up to within one latency: an end that
        # started late would otherwise find the peer's data waiting and time too little.
        _exchange(peer, token, echo)
        return _timed(lambda: _exchange(peer, send, receive), device, 0, 1)

    mine = torch.tensor([once() for _ in range(LINK_TIMED)], dtype=torch.float64, device=device)
    # A send ends once its data is buffered, so the end behind a slow sender sees the truth:
    # both ends take each round's longer time, and so agree on the link's number.
    theirs = torch.empty_like(mine)
    _exchange(peer, mine, theirs)
    # The fastest round: what the link can do, not how busy the CPUs around it were.
    return nbytes / float(torch.maximum(mine, theirs).min().item())


def _exchange(peer: int, send: torch.Tensor, receive: torch.Tensor) -> None:
    """Send and receive one buffer with `peer` at once; both posted before either is waited on.

    The phases pair ranks off disjointly, and both ends post send and receive in one batch, so
    neither blocks waiting for the other to receive first (the deadlock of two blocking sends).
    """
    ops = [
        torch_dist.P2POp(torch_dist.isend, send, peer),
        torch_dist.P2POp(torch_dist.irecv, receive, peer),
    ]
    for request in torch_dist.batch_isend_irecv(ops):
        request.wait()


def _barrier(device: torch.device) -> None:
    # An all-reduce rather than barrier(): NCCL's barrier guesses a device, this one does not.
    torch_dist.all_reduce(torch.zeros(1, device=device))


def _all_true(flag: bool, device: torch.device) -> bool:
    found = torch.tensor([1 if flag else 0], dtype=torch.int64, device=device)
    torch_dist.all_reduce(found, op=torch_dist.ReduceOp.MIN)
    return bool(found.item())


def _encode(name: str, device: torch.device) -> torch.Tensor:
    raw = name.encode()[:NAME_BYTES]
    padded = raw + bytes(NAME_BYTES - len(raw))
    return torch.frombuffer(bytearray(padded), dtype=torch.uint8).to(device)


def _decode(tensor: torch.Tensor) -> str:
    return bytes(tensor.cpu().tolist()).rstrip(b"\0").decode(errors="replace")


def _find_slow_links(
    seat: ring.RingSeat, timed: _Timed, rank: int, min_fraction: float, device: torch.device
) -> tuple[list[verdict.Link], verdict.NetworkVerdict]:
    """Agree on the yardstick, collect the slowest links on every rank, and judge them."""
    counts = torch.zeros(verdict.BINS, dtype=torch.float64, device=device)
    known = [bw for bw in (timed.out_bandwidth, timed.in_bandwidth) if bw is not None]
    if known:
        counts[verdict.histogram_bin(max(known))] = 1
    torch_dist.all_reduce(counts)
    reference = verdict.histogram_median(counts.tolist())
    if reference is None:
        return [], verdict.find_slow_links(
            [], reference=None, ring_size=seat.size, min_fraction=min_fraction
        )
    out_bw = timed.out_bandwidth
    slow = out_bw is not None and out_bw < min_fraction * reference
    slots = _slowest_ranks(_key(out_bw, rank) if out_bw is not None else NOT_SLOW, device)
    links, slow_count = _named_links(seat, timed, rank, slots, slow, device)
    return links, verdict.find_slow_links(
        links,
        reference=reference,
        ring_size=seat.size,
        min_fraction=min_fraction,
        slow_count=slow_count,
    )


def _key(bytes_per_s: float, rank: int) -> int:
    kib_per_s = min(int(bytes_per_s // 1024), (1 << (63 - RANK_BITS)) - 1)
    return (kib_per_s << RANK_BITS) | rank


def _slowest_ranks(key: int, device: torch.device) -> list[int]:
    """The ranks owning the WORST_NAMED slowest links: one 8-byte all-reduce MIN per link.

    A fixed-size answer instead of gathering every rank's link at rank 0.
    """
    mine = torch.tensor([key], dtype=torch.int64, device=device)
    found = []
    for _ in range(WORST_NAMED):
        least = mine.clone()
        torch_dist.all_reduce(least, op=torch_dist.ReduceOp.MIN)
        value = int(least.item())
        if value == NOT_SLOW:
            break
        found.append(value & ((1 << RANK_BITS) - 1))
        if value == key:
            mine.fill_(NOT_SLOW)
    return found


def _named_links(
    seat: ring.RingSeat,
    timed: _Timed,
    rank: int,
    slots: list[int],
    slow: bool,
    device: torch.device,
) -> tuple[list[verdict.Link], int]:
    """Each named slow link's numbers and end names from its owner; all-reduce SUM (one writer
    per slot), with the count of all slow links in the last number."""
    numbers = torch.zeros(WORST_NAMED * 3 + 1, dtype=torch.float64, device=device)
    names = torch.zeros(WORST_NAMED, 2, NAME_BYTES, dtype=torch.uint8, device=device)
    numbers[-1] = 1 if slow else 0
    if rank in slots and timed.out_bandwidth is not None:
        slot = slots.index(rank)
        numbers[slot * 3 : slot * 3 + 3] = torch.tensor(
            [timed.out_bandwidth, seat.lane, seat.position], dtype=torch.float64
        )
        names[slot, 0] = _encode(timed.own_name, device)
        names[slot, 1] = _encode(timed.next_name, device)
    torch_dist.all_reduce(numbers)
    torch_dist.all_reduce(names)
    values = numbers.tolist()
    links = [
        verdict.Link(
            lane=int(values[i * 3 + 1]),
            source=int(values[i * 3 + 2]),
            target=(int(values[i * 3 + 2]) + 1) % seat.size,
            source_name=_decode(names[i, 0]),
            target_name=_decode(names[i, 1]),
            bandwidth=values[i * 3],
        )
        for i in range(len(slots))
    ]
    return links, int(values[-1])
