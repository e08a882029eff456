"""Cross-rank consistency: differences are named by rank and host; the table shows everyone."""

from __future__ import annotations

import dataclasses

from trainbox.peers import PeerFacts, mismatches, table

BASE = PeerFacts(
    rank=0, host="n1", trainbox="0.1.0", torch="2.13.0", cuda="12.8", nccl="2.27.3",
    image_revision="abc123", config_hash="f00d", gpu_model="NVIDIA H100", cpu_count=12,
)  # fmt: skip


def cluster(*changes: dict[str, object]) -> list[PeerFacts]:
    return [
        dataclasses.replace(BASE, rank=rank, host=f"n{rank // 2 + 1}", **change)  # type: ignore[arg-type]
        for rank, change in enumerate(changes)
    ]


def test_identical_ranks_agree() -> None:
    assert mismatches(cluster({}, {}, {}, {})) == []


def test_a_stale_image_is_named_with_its_rank_and_host() -> None:
    (problem,) = mismatches(cluster({}, {}, {}, {"image_revision": "old999"}))
    assert (
        problem
        == "image_revision differs: 'abc123' on rank 0, 1, 2 (n1, n2); 'old999' on rank 3 (n2)"
    )


def test_every_differing_field_is_reported() -> None:
    problems = mismatches(cluster({}, {"torch": "2.12.0", "config_hash": "beef"}))
    assert [p.split(" ")[0] for p in problems] == ["torch", "config_hash"]


def test_table_has_a_row_per_rank() -> None:
    lines = table(cluster({}, {"cpu_count": 6})).splitlines()
    assert lines[0].split()[:3] == ["rank", "host", "trainbox"]
    assert len(lines) == 3
    assert lines[2].split()[-1] == "6"
