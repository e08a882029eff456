"""The network check's result as one JSON-able object and as tables for a person (pure)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from trainbox.network import bandwidth, transport
from trainbox.network.verdict import format_rate

if TYPE_CHECKING:
    from trainbox.network.probe import Result


def as_dict(result: Result) -> dict[str, Any]:
    """Everything measured and judged; bandwidths in bytes per second, times in seconds."""
    judged = result.verdict
    return {
        "world_size": result.world_size,
        "backend": result.backend,
        "device": result.device,
        # The all-reduce sweep under its first name; all-gather and reduce-scatter beside it.
        "sweep": [dataclasses.asdict(row) for row in result.sweep],
        "all_gather": [dataclasses.asdict(row) for row in result.all_gather],
        "reduce_scatter": [dataclasses.asdict(row) for row in result.reduce_scatter],
        "ring": {
            "size": result.ring_size,
            "of": "nodes" if result.ring_of_nodes else "ranks",
            "lanes": result.lanes,
            "link_bytes": result.link_bytes,
        },
        # The slowest links (every link of a small ring), each marked slow or not.
        "links": [
            {**dataclasses.asdict(link), "slow": link in judged.slow_links} for link in result.links
        ],
        "verdict": {
            "ok": judged.ok,
            "reference": judged.reference,
            "threshold": judged.threshold,
            "slow_links": judged.slow_count,
            "slow_nodes": list(judged.slow_nodes),
            "message": judged.message,
        },
        # Nodes per network NCCL chose (`none` under gloo), and the absolute floor.
        "transport": {
            "nodes": [dataclasses.asdict(count) for count in result.transports],
            "mixed": transport.mixed(result.transports),
        },
        "floor": dataclasses.asdict(result.floor),
        "nccl_log": list(result.nccl_lines),
        "ok": result.ok,
    }


def render(result: Result) -> str:
    """The sweeps' table (as nccl-tests prints it), the slow links, then the verdict line."""
    of = "nodes" if result.ring_of_nodes else "ranks"
    lines = [
        f"collective sweep: {result.world_size} ranks, {result.backend} on {result.device}"
        " (time: slowest rank's mean; size: the whole buffer)",
        f"{'collective':<14} {'size (B)':>12} {'time (us)':>12} {'algbw (GB/s)':>13}"
        f" {'busbw (GB/s)':>13}",
    ]
    collectives = (
        (bandwidth.ALL_REDUCE, result.sweep),
        (bandwidth.ALL_GATHER, result.all_gather),
        (bandwidth.REDUCE_SCATTER, result.reduce_scatter),
    )
    lines += [
        f"{name:<14} {row.size:>12} {row.seconds * 1e6:>12.1f} {row.algbw / 1e9:>13.3f}"
        f" {row.busbw / 1e9:>13.3f}"
        for name, rows in collectives
        for row in rows
    ]
    lines.append(
        f"ring of {result.ring_size} {of}, {result.lanes} lane(s),"
        f" {result.link_bytes} bytes each way per link"
    )
    judged = result.verdict
    if judged.reference is not None and judged.threshold is not None:
        lines.append(
            f"reference link {format_rate(judged.reference)}, slow below"
            f" {format_rate(judged.threshold)}; slow links: {judged.slow_count};"
            f" the {len(result.links)} slowest:"
        )
    lines += [
        f"  lane {k.lane}: {k.source_name} <-> {k.target_name}  {format_rate(k.bandwidth)}"
        + ("  SLOW" if k in judged.slow_links else "")
        for k in result.links
    ]
    lines.append(f"transport: {transport.describe(result.transports)}")
    lines.append(f"floor: {result.floor.message}")
    lines.append(f"verdict: {'ok' if judged.ok else 'SLOW'}: {judged.message}")
    mixed = transport.mixed(result.transports)
    if mixed:
        lines.append(f"verdict: MIXED: {mixed}")
    if not result.floor.ok:
        lines.append(f"verdict: BELOW FLOOR: {result.floor.message}")
    return "\n".join(lines)
