"""Slurm hostlist and task-count expansion, including the forms other tools get wrong."""

from __future__ import annotations

import pytest

from trainbox.launch import hostlist


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("a,b , c", ["a", "b", "c"]),
        ("gpu[01-04,07],cpu3", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]),
        ("host[5-7]", ["host5", "host6", "host7"]),
        ("host[22]", ["host22"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        # Several bracket groups: Lightning's regex returns `rack1` here.
        ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
        ("node[01-02]-ib", ["node01-ib", "node02-ib"]),
        ("1.2.3.[089, 100-101]", ["1.2.3.089", "1.2.3.100", "1.2.3.101"]),
        ("alpha[3,1], beta", ["alpha3", "alpha1", "beta"]),
        ("my-host.cluster", ["my-host.cluster"]),
    ],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert hostlist.expand(text) == hosts


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("gpu[01-04,07],cpu3", "gpu01"),
        ("rack[2-3]-node[04-05]", "rack2-node04"),
        ("x[0-99999999]", "x0"),
    ],
)
def test_first_host_does_not_expand_the_rest(text: str, first: str) -> None:
    assert hostlist.first_host(text) == first


@pytest.mark.parametrize(
    "text",
    ["", "  ", "gpu[01-", "gpu01]", "gpu[[1]]", "gpu[]", "gpu[a-b]", "gpu[4-2]", "gpu[1-2-3]"],
)
def test_malformed_hostlists_raise_value_error(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is tested through the detector
        hostlist.first_host(text)


@pytest.mark.parametrize(
    ("text", "counts"),
    [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2),3", [4, 4, 3]), ("1,2", [1, 2])],
)
def test_task_counts_per_node(text: str, counts: list[int]) -> None:
    tasks = hostlist.task_counts(text)
    assert tasks.nodes == len(counts)
    assert [tasks.on_node(node) for node in range(len(counts))] == counts


def test_a_node_past_the_list_has_no_task_count() -> None:
    assert hostlist.task_counts("2(x3),1").on_node(4) is None


def test_task_counts_cost_the_text_not_the_node_count() -> None:
    # A huge repeat (corrupt or hostile environment) must not be expanded into a list per node.
    tasks = hostlist.task_counts("8(x1000000000000),4")
    assert tasks.nodes == 1_000_000_000_001
    assert (tasks.on_node(999_999_999_999), tasks.on_node(1_000_000_000_000)) == (8, 4)


@pytest.mark.parametrize("text", ["", "x", "2(3)", "2(x)", "-1", "2(x0)"])
def test_bad_task_counts_raise(text: str) -> None:
    with pytest.raises(ValueError, match="is not N or N"):
        hostlist.task_counts(text)
