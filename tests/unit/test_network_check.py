"""doctor --network's pure parts: nccl-tests' bandwidth arithmetic, the ring seats, slow links."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from trainbox import cli
from trainbox.network import bandwidth, probe, report, ring, transport, verdict
from trainbox.network.verdict import Link

from runs import clean_env

GB = 1e9


def ring_links(speeds: list[float], names: str, lane: int = 0) -> list[Link]:
    """Link i joins names[i] -> names[i + 1] round the ring, at speeds[i] GB/s."""
    size = len(names)
    return [
        Link(
            lane=lane, source=i, target=(i + 1) % size, source_name=names[i],
            target_name=names[(i + 1) % size], bandwidth=speed * GB,
        )
        for i, speed in enumerate(speeds)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("size", "seconds", "world", "algbw", "busbw"),
    [
        # nccl-tests doc/PERFORMANCE.md: algbw = S / t; all-reduce busbw = algbw * 2(n-1)/n.
        (1_000_000, 0.001, 2, 1e9, 1e9),
        (1_000_000, 0.001, 4, 1e9, 1.5e9),
        (8_000_000, 0.002, 8, 4e9, 7e9),
        (1024, 0.5, 1, 2048.0, 0.0),
    ],
)
def test_bandwidths_follow_nccl_tests(
    size: int, seconds: float, world: int, algbw: float, busbw: float
) -> None:
    row = bandwidth.row(size, seconds, world)
    assert (row.algbw, row.busbw) == pytest.approx((algbw, busbw))
    assert bandwidth.row(size, seconds, world, bandwidth.ALL_REDUCE) == row


@pytest.mark.parametrize(
    ("collective", "size", "seconds", "world", "algbw", "busbw"),
    [
        # nccl-tests doc/PERFORMANCE.md: S is the gathered output (all-gather) or the input
        # before scattering (reduce-scatter); busbw = algbw * (n-1)/n for both.
        ("all_gather", 1_000_000, 0.001, 2, 1e9, 0.5e9),
        ("all_gather", 1_000_000, 0.001, 4, 1e9, 0.75e9),
        ("all_gather", 8_000_000, 0.002, 8, 4e9, 3.5e9),
        ("reduce_scatter", 1_000_000, 0.001, 2, 1e9, 0.5e9),
        ("reduce_scatter", 1_000_000, 0.001, 4, 1e9, 0.75e9),
        ("reduce_scatter", 8_000_000, 0.002, 8, 4e9, 3.5e9),
        ("reduce_scatter", 1024, 0.5, 1, 2048.0, 0.0),
        # The same S and t: all-reduce moves twice what the other two do.
        ("all_reduce", 8_000_000, 0.002, 8, 4e9, 7e9),
    ],
)
def test_each_collective_has_nccl_tests_bus_bandwidth(
    collective: str, size: int, seconds: float, world: int, algbw: float, busbw: float
) -> None:
    row = bandwidth.row(size, seconds, world, collective)
    assert (row.size, row.seconds) == (size, seconds)
    assert (row.algbw, row.busbw) == pytest.approx((algbw, busbw))
    assert bandwidth.BUSBW[collective](algbw, world) == pytest.approx(busbw)


def test_the_collectives_are_all_reduce_all_gather_reduce_scatter() -> None:
    assert bandwidth.COLLECTIVES == ("all_reduce", "all_gather", "reduce_scatter")


@pytest.mark.parametrize(
    ("sizes", "world", "shards"),
    [
        # A whole float32 per rank: S rounds down to a multiple of 4n bytes, never up.
        ([1024, 4096, 65536], 2, [1024, 4096, 65536]),
        ([1024, 4096, 100_000], 3, [1020, 4092, 99_996]),
        # 512 ranks need 2 KiB for one float each: 1 KiB is dropped, 4 KiB kept.
        ([1024, 4096], 512, [4096]),
        ([1024], 512, []),
        # Two sizes that round to one are measured once.
        ([1024, 1028], 256, [1024]),
    ],
)
def test_all_gather_and_reduce_scatter_sizes_fit_the_ranks_and_the_maximum(
    sizes: list[int], world: int, shards: list[int]
) -> None:
    assert bandwidth.shard_sizes(sizes, world) == shards


@pytest.mark.parametrize(
    ("max_bytes", "sizes"),
    [
        (1024, [1024]),
        (64 * 1024, [1024, 4096, 16384, 65536]),
        (100_000, [1024, 4096, 16384, 65536, 100_000]),
        (256 * 1024**2, [1024 * 4**i for i in range(10)]),
    ],
)
def test_sweep_grows_by_four_and_ends_at_the_maximum(max_bytes: int, sizes: list[int]) -> None:
    assert bandwidth.sweep_sizes(max_bytes) == sizes


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6, 7, 8, 9])
def test_no_ring_position_is_in_two_links_of_one_phase(size: int) -> None:
    seats = [seat_of(rank=r, world=size) for r in range(size)]
    for phase in range(ring.PHASES):
        busy = [
            s.position
            for s in seats
            for peer, when in ((s.next_rank, s.out_phase), (s.prev_rank, s.in_phase))
            if peer is not None and when == phase
        ]
        assert len(busy) == len(set(busy)), (size, phase)
    links = [(s.position, s.next_rank) for s in seats if s.next_rank is not None]
    assert len(links) == (1 if size == 2 else size)


def seat_of(*, rank: int, world: int, nodes: int = 1, node_major: bool = True) -> ring.RingSeat:
    per_node = world // nodes
    return ring.seat(
        rank=rank, world_size=world, node_rank=rank // per_node, num_nodes=nodes,
        local_rank=rank % per_node, local_world_size=per_node, node_major=node_major,
    )  # fmt: skip


def test_each_local_rank_pairs_with_the_same_local_rank_on_the_next_node() -> None:
    # 3 nodes of 4: rank 5 is node 1's local rank 1.
    seat = seat_of(rank=5, world=12, nodes=3)
    assert (seat.lane, seat.position, seat.size, seat.of_nodes) == (1, 1, 3, True)
    assert (seat.next_rank, seat.prev_rank) == (9, 1)


def test_ranks_not_laid_out_node_major_form_one_ring_of_ranks() -> None:
    seat = seat_of(rank=5, world=12, nodes=3, node_major=False)
    assert (seat.lane, seat.position, seat.size, seat.of_nodes) == (0, 5, 12, False)
    assert (seat.next_rank, seat.prev_rank) == (6, 4)


def test_one_process_has_no_link() -> None:
    seat = seat_of(rank=0, world=1)
    assert (seat.next_rank, seat.prev_rank) == (None, None)


HEALTHY = ring_links([10, 10, 10, 10], "abcd")
ONE_SLOW_LINK = ring_links([10, 2, 10, 10], "abcd")
ONE_SLOW_NODE = ring_links([10, 2, 3, 10], "abcd")
THREE_NODES_ONE_SLOW = ring_links([10, 0.1, 0.1], "abc")
TWO_NODES_SLOW_LANE = [*ring_links([10], "ab", lane=0), *ring_links([1], "ab", lane=1)]
TWO_NODES_ONE_LINK = ring_links([1], "ab")


@pytest.mark.parametrize(
    ("links", "ring_size", "slow", "nodes", "message"),
    [
        (HEALTHY, 4, [], (), "all links within 50% of 10.00 GB/s"),
        (ONE_SLOW_LINK, 4, [("b", "c")], (), "slow link: b <-> c 2.00 GB/s (below 50% of 10.00 GB/s)"),
        (ONE_SLOW_NODE, 4, [("b", "c"), ("c", "d")], ("c",), "slow node: c (both of its ring links are below 50% of 10.00 GB/s)"),
        # Two of three links are slow: the median link would hide the slow node.
        (THREE_NODES_ONE_SLOW, 3, [("b", "c"), ("c", "a")], ("c",), "slow node: c (both of its ring links are below 50% of 10.00 GB/s)"),
        (TWO_NODES_SLOW_LANE, 2, [("a", "b")], (), "slow link: a <-> b 1.00 GB/s (below 50% of 10.00 GB/s); with 2 nodes a slow node cannot be told from a slow link"),
        # One link alone is its own yardstick: nothing to compare it with.
        (TWO_NODES_ONE_LINK, 2, [], (), "all links within 50% of 1.00 GB/s"),
        ([], 1, [], (), "no link to measure: the ring has 1 position(s)"),
    ],
    ids=["healthy", "slow-link", "slow-node", "3-nodes-slow-node", "2-nodes", "2-nodes-1-link", "1-node"],
)  # fmt: skip
def test_find_slow_links(
    links: list[Link],
    ring_size: int,
    slow: list[tuple[str, str]],
    nodes: tuple[str, ...],
    message: str,
) -> None:
    found = verdict.find_slow_links(
        links,
        reference=verdict.reference_bandwidth(links),
        ring_size=ring_size,
        min_fraction=verdict.DEFAULT_MIN_FRACTION,
    )
    assert [(k.source_name, k.target_name) for k in found.slow_links] == slow
    assert (found.slow_nodes, found.message, found.ok) == (nodes, message, not slow)


def test_slow_links_beyond_those_listed_are_counted() -> None:
    found = verdict.find_slow_links(
        ONE_SLOW_LINK, reference=10 * GB, ring_size=4, min_fraction=0.5, slow_count=9
    )
    assert found.slow_count == 9
    assert found.message.endswith("2.00 GB/s and 8 more (below 50% of 10.00 GB/s)")


def test_the_cut_off_is_the_given_fraction_of_the_reference() -> None:
    found = verdict.find_slow_links(ONE_SLOW_LINK, reference=10 * GB, ring_size=4, min_fraction=0.1)
    assert found.ok
    assert found.threshold == pytest.approx(1 * GB)


@pytest.mark.parametrize(
    ("speeds", "median"),
    [([1e9], 1e9), ([1e6, 2e9, 3e9], 2e9), ([5e4, 5e4, 7e10, 7e10], 7e10), ([2e3, 1e15, 3e3], 3e3)],
)
def test_the_histogram_median_is_within_half_a_bin(speeds: list[float], median: float) -> None:
    counts = [0.0] * verdict.BINS
    for speed in speeds:
        counts[verdict.histogram_bin(speed)] += 1
    found = verdict.histogram_median(counts)
    assert found == pytest.approx(median, rel=2 ** (0.5 / verdict.BINS_PER_OCTAVE) - 1)


def test_an_empty_histogram_has_no_median() -> None:
    assert verdict.histogram_median([0.0] * verdict.BINS) is None


def result_of(links: list[Link], ring_size: int) -> probe.Result:
    judged = verdict.find_slow_links(
        links, reference=verdict.reference_bandwidth(links), ring_size=ring_size, min_fraction=0.5
    )
    return probe.Result(
        world_size=ring_size, backend="nccl", device="cuda:0",
        sweep=(bandwidth.row(1024, 20e-6, ring_size), bandwidth.row(4096, 25e-6, ring_size)),
        all_gather=(bandwidth.row(1020, 10e-6, ring_size, "all_gather"),),
        reduce_scatter=(bandwidth.row(1020, 12e-6, ring_size, "reduce_scatter"),),
        ring_size=ring_size, ring_of_nodes=True, lanes=1, link_bytes=4096,
        links=tuple(sorted(links, key=lambda k: k.bandwidth)), verdict=judged,
        transports=(transport.NodeCount(name="IB", nodes=ring_size, first_host="a"),),
        floor=transport.floor(judged.reference, None, nics=1, lanes=1, min_fraction=0.5),
    )  # fmt: skip


def test_the_table_shows_the_sweep_then_the_links_then_the_verdict() -> None:
    text = report.render(result_of(THREE_NODES_ONE_SLOW, 3))
    assert text.splitlines() == [
        "collective sweep: 3 ranks, nccl on cuda:0"
        " (time: slowest rank's mean; size: the whole buffer)",
        "collective         size (B)    time (us)  algbw (GB/s)  busbw (GB/s)",
        "all_reduce             1024         20.0         0.051         0.068",
        "all_reduce             4096         25.0         0.164         0.218",
        "all_gather             1020         10.0         0.102         0.068",
        "reduce_scatter         1020         12.0         0.085         0.057",
        "ring of 3 nodes, 1 lane(s), 4096 bytes each way per link",
        "reference link 10.00 GB/s, slow below 5.00 GB/s; slow links: 2; the 3 slowest:",
        "  lane 0: b <-> c  100.00 MB/s  SLOW",
        "  lane 0: c <-> a  100.00 MB/s  SLOW",
        "  lane 0: a <-> b  10.00 GB/s",
        "transport: IB on 3 node(s)",
        "floor: no rated NIC speed known",
        "verdict: SLOW: slow node: c (both of its ring links are below 50% of 10.00 GB/s)",
    ]


def test_the_json_holds_the_same_data() -> None:
    found = report.as_dict(result_of(THREE_NODES_ONE_SLOW, 3))
    assert [row["size"] for row in found["sweep"]] == [1024, 4096]
    # 1020 B over 3 ranks: algbw = S / t; busbw = algbw * (3-1)/3.
    assert found["all_gather"] == [
        {"size": 1020, "seconds": 10e-6, "algbw": pytest.approx(102e6),
         "busbw": pytest.approx(68e6)}
    ]  # fmt: skip
    assert found["reduce_scatter"] == [
        {"size": 1020, "seconds": 12e-6, "algbw": pytest.approx(85e6),
         "busbw": pytest.approx(85e6 * 2 / 3)}
    ]  # fmt: skip
    assert [(k["source_name"], k["slow"]) for k in found["links"]] == [
        ("b", True), ("c", True), ("a", False),
    ]  # fmt: skip
    assert found["verdict"] == {
        "ok": False, "reference": 10 * GB, "threshold": 5 * GB, "slow_links": 2,
        "slow_nodes": ["c"],
        "message": "slow node: c (both of its ring links are below 50% of 10.00 GB/s)",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--network", "--network-max-bytes", "512"], "'512' is not a size of at least 1K"),
        (["--network", "--network-max-bytes", "lots"], "'lots' is not a size of at least 1K"),
        (["--network", "--network-min-fraction", "1.5"], "'1.5' is not a fraction in (0, 1]"),
        (["--network", "--network-min-fraction", "0"], "'0' is not a fraction in (0, 1]"),
        (["--network-max-bytes", "1M"], "--network-max-bytes given without --network"),
        (["--network", "--network-rated-gbps", "0"], "'0' is not a positive speed in Gbit/s"),
        (["--network-rated-gbps", "100"], "--network-rated-gbps given without --network"),
    ],
)
def test_bad_network_options_exit_2_naming_the_option(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainbox", "doctor", *args],
        env=clean_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert message in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize(("text", "size"), [("1K", 1024), ("64m", 64 << 20), ("2G", 2 << 30)])
def test_sizes_take_binary_suffixes(text: str, size: int) -> None:
    args = cli._parser().parse_args(["doctor", "--network", "--network-max-bytes", text])
    assert args.network_max_bytes == size


def test_an_all_sockets_fabric_below_its_floor_is_not_ok_though_no_link_is_slow() -> None:
    slow_everywhere = dataclasses.replace(
        result_of(THREE_NODES_ONE_SLOW, 3),
        verdict=verdict.find_slow_links([], reference=1 * GB, ring_size=3, min_fraction=0.5),
        transports=(transport.NodeCount(name="Socket", nodes=3, first_host="a"),),
        floor=transport.floor(1 * GB, 100.0, nics=1, lanes=1, min_fraction=0.5),
    )
    assert slow_everywhere.verdict.ok
    assert not slow_everywhere.ok
    found = report.as_dict(slow_everywhere)
    assert found["ok"] is False
    assert found["floor"]["floor"] == pytest.approx(6.25 * GB)
    assert found["transport"] == {
        "nodes": [{"name": "Socket", "nodes": 3, "first_host": "a"}], "mixed": None,
    }  # fmt: skip
    assert (
        report.render(slow_everywhere)
        .splitlines()[-1]
        .startswith(
            "verdict: BELOW FLOOR: below the floor: reference link 1.00 GB/s against 50% of 100 Gb/s"
        )
    )
