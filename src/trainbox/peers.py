"""Every rank must run the same software and config: compare, tabulate, refuse mismatches."""

from __future__ import annotations

import dataclasses
import socket
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainbox import __version__
from trainbox.errors import DistributedError


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerFacts:
    """What one rank runs with; every field but rank and host must agree across the job."""

    # Global rank and the host it runs on (for messages, not compared).
    rank: int
    host: str
    # Software versions.
    trainbox: str
    torch: str
    cuda: str | None
    nccl: str | None
    # TRAINBOX_IMAGE_REVISION: which image build this rank runs.
    image_revision: str | None
    # SHA-256 of the resolved config.
    config_hash: str
    # Name of this rank's GPU, None on CPU.
    gpu_model: str | None
    # CPUs this rank may keep busy (its pinning budget).
    cpu_count: int


COMPARED = tuple(f.name for f in dataclasses.fields(PeerFacts) if f.name not in ("rank", "host"))


def local(
    *, rank: int, config_hash: str, gpu_model: str | None, cpu_count: int, env: Mapping[str, str]
) -> PeerFacts:
    """This rank's facts (imports torch: called once the process group is up)."""
    import torch

    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return PeerFacts(
        rank=rank,
        host=socket.gethostname(),
        trainbox=__version__,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        nccl=nccl,
        image_revision=env.get("TRAINBOX_IMAGE_REVISION"),
        config_hash=config_hash,
        gpu_model=gpu_model,
        cpu_count=cpu_count,
    )


def mismatches(peers: Sequence[PeerFacts]) -> list[str]:
    """One line per field that differs, naming which ranks (and hosts) have which value."""
    problems = []
    for name in COMPARED:
        groups: dict[object, list[PeerFacts]] = defaultdict(list)
        for peer in peers:
            groups[getattr(peer, name)].append(peer)
        if len(groups) > 1:
            parts = [
                f"{value!r} on rank {', '.join(str(p.rank) for p in members)}"
                f" ({', '.join(sorted({p.host for p in members}))})"
                for value, members in sorted(groups.items(), key=lambda item: -len(item[1]))
            ]
            problems.append(f"{name} differs: {'; '.join(parts)}")
    return problems


def table(peers: Sequence[PeerFacts]) -> str:
    """The whole cluster, one row per rank, for rank 0's log."""
    columns = ("rank", "host", *COMPARED)
    rows = [[str(getattr(peer, column)) for column in columns] for peer in peers]
    widths = [max(len(column), *(len(row[i]) for row in rows)) for i, column in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def agree(mine: PeerFacts) -> list[PeerFacts]:
    """Swap facts with every rank; on any difference every rank raises DistributedError (exit 4)."""
    import torch.distributed as dist

    from trainbox.logs import log

    peers: list[PeerFacts | None] = [None] * dist.get_world_size()
    dist.all_gather_object(peers, mine)
    everyone = [peer for peer in peers if peer is not None]
    if mine.rank == 0:
        log.info("cluster", table="\n" + table(everyone))
    problems = mismatches(everyone)
    if problems:
        raise DistributedError(
            problems,
            hint="run the same image and config on every node (a stale image or a local edit?)",
        )
    return everyone
