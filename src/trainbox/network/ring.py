"""Who measures which link: nodes in a ring, each rank talking to at most two peers (pure).

With several nodes laid out node-major (rank = node * local_world_size + local_rank, as
torchrun and Slurm's block distribution do), local rank l of every node forms ring "lane" l:
node k's rank exchanges with the same local rank on node k+1, so each GPU's own NIC path is
tested. On one node, or when ranks are not node-major, the ranks themselves form one ring.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class RingSeat:
    """This rank's place in its ring and the two links it takes part in."""

    # Which ring: the local rank in a ring of nodes, 0 in a ring of ranks.
    lane: int
    # This rank's position in the ring (its node rank, or its rank).
    position: int
    # Positions in the ring: nodes, or ranks.
    size: int
    # Whether the ring's positions are nodes (else single ranks).
    of_nodes: bool
    # Global rank at the far end of this rank's outgoing link (position + 1); None: no such link.
    next_rank: int | None
    # Global rank at the near end of this rank's incoming link (position - 1); None: no link.
    prev_rank: int | None
    # The phase in which the outgoing / incoming link is measured (see `link_phase`).
    out_phase: int | None
    in_phase: int | None


# Links are measured one phase at a time; no rank is in two links of one phase.
PHASES = 3


def link_phase(index: int, size: int) -> int:
    """The phase of link index -> index+1: alternate 0/1 round the ring, 2 for an odd ring's last.

    A proper edge colouring of the ring: the two links of a position never share a phase, so
    each phase is a set of disjoint pairs and a link is timed without its neighbours' traffic.
    """
    if size % 2 == 1 and index == size - 1:
        return 2
    return index % 2


def seat(
    *,
    rank: int,
    world_size: int,
    node_rank: int,
    num_nodes: int,
    local_rank: int,
    local_world_size: int,
    node_major: bool,
) -> RingSeat:
    """This rank's seat: a lane of a node ring when nodes are node-major, else a ring of ranks."""
    of_nodes = num_nodes > 1 and node_major
    if of_nodes:
        lane, position, size = local_rank, node_rank, num_nodes
    else:
        lane, position, size = 0, rank, world_size

    def rank_at(where: int) -> int:
        return where * local_world_size + lane if of_nodes else where

    # Two positions share one link (0 -> 1); one position has none.
    has_out = size >= 3 or (size == 2 and position == 0)
    has_in = size >= 3 or (size == 2 and position == 1)
    before = (position - 1) % size
    return RingSeat(
        lane=lane,
        position=position,
        size=size,
        of_nodes=of_nodes,
        next_rank=rank_at((position + 1) % size) if has_out else None,
        prev_rank=rank_at(before) if has_in else None,
        out_phase=link_phase(position, size) if has_out else None,
        in_phase=link_phase(before, size) if has_in else None,
    )


def is_node_major(*, rank: int, node_rank: int, local_rank: int, local_world_size: int) -> bool:
    """Whether this rank sits where a node-major layout puts it (every rank must agree)."""
    return rank == node_rank * local_world_size + local_rank
