"""Every rank must run the same software and config: compare, tabulate, refuse mismatches."""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainbox.errors import DistributedError
from trainbox.process import provenance
from trainbox.process.provenance import Provenance
from trainbox.version import __version__

# Rows of the cluster table in rank 0's log; the rest are counted (a 4,096-rank table helps no one).
TABLE_RANKS = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerFacts:
    """What one rank runs with; COMPARED, PER_HOST and SHOWN below say which must agree where."""

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
    # sha256 of the lock the image installed (see process/provenance.py): same label, other
    # packages.
    lock_sha256: str | None
    # SHA-256 of the resolved config.
    config_hash: str
    # Name of this rank's GPU, None on CPU.
    gpu_model: str | None
    # CPUs online on this rank's machine (the node's CPU total, however it is shared out).
    node_cpus: int
    # CPUs this rank may keep busy (its pinning budget), for the table only.
    cpu_budget: int
    # torch's intra-op threads on this rank, for the table only: on CPU they are part of what
    # params_sha256 depends on.
    threads: int
    # The node's RDMA ports as NCCL would meet them (preflight.fabric.summary).
    fabric: str = ""


# The agreement policy, in one place. A difference in a COMPARED field means a stale image, a
# local edit or a different config: every rank must have the same value. PER_HOST facts describe
# one machine, so the ranks on one host must see the same value (each local rank plans its
# node's CPU partition on its own, trusting its siblings to see the same node); across hosts they
# may differ: nodes of different sizes (a heterogeneous allocation, a node with CPUs offline) run
# correctly, the smaller one only sets the pace. SHOWN facts differ legitimately from rank to
# rank (an uneven step or an uneven core split gives ranks unequal budgets): table only.
COMPARED = (
    "trainbox", "torch", "cuda", "nccl", "image_revision", "lock_sha256", "config_hash",
    "gpu_model",
)  # fmt: skip
PER_HOST = ("node_cpus",)
SHOWN = ("cpu_budget", "threads")
# NOTED facts should agree across the job, but a difference only slows it: nodes with RDMA and
# nodes without it still train, at the slowest node's speed. Rank 0 logs a warning naming them.
NOTED = ("fabric",)
# Hosts named per value in a mismatch line; the rest are counted, so the line stays one line.
HOSTS_NAMED = 3


def local(
    *,
    rank: int,
    config_hash: str,
    gpu_model: str | None,
    cpu_budget: int,
    env: Mapping[str, str],
    image: Provenance | None = None,
    fabric: str | None = None,
) -> PeerFacts:
    """This rank's facts (imports torch: called once the process group is up).

    `fabric` is read from this node's sysfs when not given.
    """
    import torch

    if fabric is None:
        from trainbox.preflight import node
        from trainbox.preflight.fabric import summary

        fabric = summary(node.read_fabric(env))

    image = image or provenance.read()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return PeerFacts(
        rank=rank,
        host=socket.gethostname(),
        trainbox=__version__,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        nccl=nccl,
        image_revision=env.get("TRAINBOX_IMAGE_REVISION"),
        lock_sha256=image.lock_sha256,
        config_hash=config_hash,
        gpu_model=gpu_model,
        node_cpus=os.cpu_count() or 0,
        cpu_budget=cpu_budget,
        threads=torch.get_num_threads(),
        fabric=fabric,
    )


def mismatches(peers: Sequence[PeerFacts]) -> list[str]:
    """One line per fact that differs where it must agree, naming which ranks have which value."""
    problems = [_differs(name, peers, "") for name in COMPARED]
    by_host: dict[str, list[PeerFacts]] = defaultdict(list)
    for peer in peers:
        by_host[peer.host].append(peer)
    for name in PER_HOST:
        problems += (_differs(name, same, f" on host {host}") for host, same in by_host.items())
    return [problem for problem in problems if problem]


def differences(peers: Sequence[PeerFacts]) -> list[str]:
    """One line per NOTED fact that differs, naming which ranks and hosts have which value."""
    return [problem for problem in (_differs(name, peers, "") for name in NOTED) if problem]


def _differs(name: str, peers: Sequence[PeerFacts], where: str) -> str:
    """`name differs{where}: value on rank ... (hosts); ...`, or '' when all peers agree."""
    groups: dict[object, list[PeerFacts]] = defaultdict(list)
    for peer in peers:
        groups[getattr(peer, name)].append(peer)
    if len(groups) < 2:
        return ""
    parts = [
        f"{value!r} on {_ranks(p.rank for p in members)} ({_hosts(p.host for p in members)})"
        for value, members in sorted(groups.items(), key=lambda item: -len(item[1]))
    ]
    return f"{name} differs{where}: {'; '.join(parts)}"


def _ranks(ranks: Iterable[int]) -> str:
    """`rank 3` or `ranks 0-2399, 2408-4095`: a line that stays short at thousands of ranks."""
    ordered = sorted(ranks)
    spans: list[list[int]] = []
    for rank in ordered:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in spans)
    return f"rank {text}" if len(ordered) == 1 else f"ranks {text}"


def _hosts(hosts: Iterable[str]) -> str:
    """Up to HOSTS_NAMED host names, then how many more."""
    names = sorted(set(hosts), key=_natural)
    more = len(names) - HOSTS_NAMED
    shown = ", ".join(names[:HOSTS_NAMED])
    return f"{shown} and {more} more hosts" if more > 0 else shown


def _natural(host: str) -> tuple[str, int]:
    # n2 before n10: the host names of a cluster differ in a trailing number.
    stem = host.rstrip("0123456789")
    digits = host[len(stem) :]
    return stem, int(digits) if digits else -1


def table(peers: Sequence[PeerFacts]) -> str:
    """The cluster for rank 0's log: a row for each of the first TABLE_RANKS ranks, then a count
    of the rest (a mismatch anywhere is reported on its own, naming its ranks)."""
    columns = ("rank", "host", *COMPARED, *PER_HOST, *SHOWN)
    shown = peers[:TABLE_RANKS]
    rows = [[str(getattr(peer, column)) for column in columns] for peer in shown]
    widths = [max(len(column), *(len(row[i]) for row in rows)) for i, column in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]  # fmt: skip
    if len(peers) > len(shown):
        hosts = {peer.host for peer in peers} - {peer.host for peer in shown}
        lines.append(f"… and {len(peers) - len(shown):,} more ranks on {len(hosts):,} more hosts")
    return "\n".join(lines)


def agree(mine: PeerFacts) -> list[PeerFacts]:
    """Rank 0 judges every rank's facts; on any difference every rank raises DistributedError.

    Only rank 0 receives the world's facts (its table needs them); every other rank sends its
    own and receives the verdict, so a rank's traffic does not grow with the job. Returns the
    facts rank 0 gathered (on rank 0) or this rank's own.
    """
    from trainbox.distributed import consensus
    from trainbox.logs import log

    gathered = consensus.to_rank0(mine)
    everyone = gathered or [mine]
    verdict: list[str] | None = None
    if gathered is not None:
        log.info("cluster", ranks=len(everyone), table=table(everyone))
        verdict = mismatches(everyone)
        for line in differences(everyone):
            log.warning(
                "nodes differ",
                message=line,
                hint="NCCL runs at the slowest node's network: check the nodes named with"
                " `trainbox doctor` (its fabric check says why)",
            )
    verdict = consensus.from_rank0(verdict)
    if verdict:
        raise DistributedError(
            verdict,
            hint="run the same image and config on every node (a stale image or a local edit?)",
        )
    return everyone
