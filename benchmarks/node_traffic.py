"""The bytes that leave a node per step under fsdp and hsdp: predicted from the mesh and the
parameters, counted from traffic_probe.py's files, both turned into bytes by one model.

The model. A collective is made by a group of ranks; `nbytes` is the whole tensor the group
shares (an all-gather's output, a reduce-scatter's input, an all-reduce's or a broadcast's
tensor). Ranks sit on nodes as rank // ranks_per_node. Ranks of one node first combine their
parts over the node's own links (free here); the N nodes the group spans then exchange the rest
at the bandwidth-optimal minimum (Patarasuk and Yuan), each node sending out
    all-gather, reduce-scatter, broadcast: nbytes (N - 1) / N      all-reduce: 2 nbytes (N - 1) / N
(an all-reduce is a reduce-scatter, then an all-gather). A group inside one node sends nothing
out. Groups spread over their nodes unevenly are refused: a mesh never makes one.

FSDP2 pads each parameter's dim 0 to a multiple of the shard group's size before it shards it,
and every collective carries the padded shards; the prediction counts the padding.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# How many times each kind's nbytes crosses out of every node, times (N - 1) / N.
CROSSINGS = {"all_gather": 1, "reduce_scatter": 1, "broadcast": 1, "all_reduce": 2}
# The module FSDP2 makes its collectives from; calls from elsewhere are trainbox's own.
FSDP_SOURCE = "torch.distributed.fsdp."


@dataclass(frozen=True, kw_only=True, slots=True)
class Collective:
    """One collective as every rank of its group makes it."""

    # all_gather, reduce_scatter, all_reduce or broadcast.
    kind: str
    # The group's ranks, ascending.
    ranks: tuple[int, ...]
    # The whole tensor the group shares (see the module's docstring).
    nbytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Unit:
    """One sharded unit: its parameters' shapes and how often a step gathers them."""

    shapes: tuple[tuple[int, ...], ...]
    # 2 when it reshards after forward (gathered again for backward), 1 for the root.
    gathers: int = 2


def padded_shard_numel(shape: Sequence[int], shard: int) -> int:
    """Elements of one rank's shard of a parameter: dim 0 padded to a multiple of `shard`."""
    if not shape:
        return 1  # a scalar is one element on every rank
    return math.ceil(shape[0] / shard) * math.prod(shape[1:])


def mesh_groups(mesh: tuple[int, int]) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(shard groups, replicate groups) of a (replicate, shard) mesh over consecutive ranks."""
    replicate, shard = mesh
    shards = [tuple(range(r * shard, (r + 1) * shard)) for r in range(replicate)]
    replicas = [tuple(range(s, replicate * shard, shard)) for s in range(shard)]
    return shards, replicas


def predict_step(
    mesh: tuple[int, int],
    units: Sequence[Unit],
    *,
    param_bytes: int = 4,
    reduce_bytes: int = 4,
) -> Counter[Collective]:
    """The collectives FSDP2 makes in one training step (no accumulation), and how many of each.

    Per unit and shard group: `gathers` all-gathers of its padded shards in the parameter dtype
    and one reduce-scatter of its gradients in the reduce dtype; with replicas (hsdp), one
    all-reduce of each rank's reduced gradient shard over its replicate group.
    """
    replicate, shard = mesh
    shards, replicas = mesh_groups(mesh)
    step: Counter[Collective] = Counter()
    for unit in units:
        numel = sum(padded_shard_numel(shape, shard) for shape in unit.shapes)
        if not numel:
            continue  # a root with no parameters of its own makes no collective
        for group in shards:
            step[Collective(kind="all_gather", ranks=group,
                            nbytes=shard * numel * param_bytes)] += unit.gathers  # fmt: skip
            step[Collective(kind="reduce_scatter", ranks=group,
                            nbytes=shard * numel * reduce_bytes)] += 1  # fmt: skip
        if replicate > 1:
            for group in replicas:
                step[Collective(kind="all_reduce", ranks=group, nbytes=numel * reduce_bytes)] += 1
    return step


def units_of(model: torch.nn.Module, *, reshard_after_forward: bool = True) -> list[Unit]:
    """The units trainbox shards `model` into (its repeated blocks, then the root's own rest)."""
    from trainbox.train.parallel.blocks import repeated_blocks

    blocks = repeated_blocks(model)
    inside = {id(p) for block in blocks for p in block.parameters()}
    gathers = 2 if reshard_after_forward else 1
    found = [Unit(shapes=tuple(tuple(p.shape) for p in block.parameters()), gathers=gathers)
             for block in blocks]  # fmt: skip
    rest = tuple(tuple(p.shape) for p in model.parameters() if id(p) not in inside)
    return [*found, Unit(shapes=rest, gathers=1)]


def leaving(collective: Collective, ranks_per_node: int) -> dict[int, float]:
    """Bytes that leave each node the collective's group spans (the module's model)."""
    spread = Counter(rank // ranks_per_node for rank in collective.ranks)
    if len(set(spread.values())) > 1:
        raise ValueError(f"group {collective.ranks} spans its nodes unevenly: {dict(spread)}")
    nodes = len(spread)
    each = CROSSINGS[collective.kind] * collective.nbytes * (nodes - 1) / nodes
    return {node: each for node in sorted(spread)}


def bytes_leaving(
    collectives: Mapping[Collective, float], ranks_per_node: int, nodes: int
) -> list[float]:
    """Bytes leaving each of `nodes` nodes for these collectives, each made `count` times."""
    out = [0.0] * nodes
    for collective, count in collectives.items():
        for node, size in leaving(collective, ranks_per_node).items():
            out[node] += size * count
    return out


def counted(
    rank_files: Iterable[Mapping[str, Any]],
) -> tuple[Counter[Collective], Counter[Collective]]:
    """(FSDP2's, everyone else's) collectives from every rank's traffic_probe.py file.

    A collective's count is what each rank of its group recorded; ranks that disagree mean a
    rank's file is missing a call (ValueError).
    """
    seen: dict[tuple[Collective, bool], dict[int, int]] = {}
    for found in rank_files:
        for call in found["calls"]:
            key = (Collective(kind=call["kind"], ranks=tuple(call["ranks"]), nbytes=call["bytes"]),
                   call["source"].startswith(FSDP_SOURCE))  # fmt: skip
            by_rank = seen.setdefault(key, {})
            by_rank[found["rank"]] = by_rank.get(found["rank"], 0) + call["count"]
    fsdp: Counter[Collective] = Counter()
    other: Counter[Collective] = Counter()
    for (collective, from_fsdp), by_rank in seen.items():
        counts = {by_rank.get(rank, 0) for rank in collective.ranks}
        if len(counts) != 1:
            raise ValueError(f"the ranks of {collective} counted it differently: {by_rank}")
        (fsdp if from_fsdp else other)[collective] += counts.pop()
    return fsdp, other
