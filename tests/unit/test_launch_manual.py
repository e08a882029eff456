"""RANK/WORLD_SIZE/MASTER_* exported by hand on each node; LOCAL_RANK optional."""

from __future__ import annotations

import pytest

from trainbox.errors import LaunchError
from trainbox.launch import detect

from launchcase import expect, topology

NODE = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # One process per node, no LOCAL_RANK: the common two-node recipe.
        (NODE, expect("env", 1, 0, 2, 1, 1, 2, "10.0.0.5", 29400)),
        (
            NODE | {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
            expect("env", 3, 1, 4, 2, 1, 2, "10.0.0.5", 29400),
        ),
        (
            NODE
            | {
                "RANK": "3",
                "WORLD_SIZE": "4",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "NODE_RANK": "1",
            },
            expect("env", 3, 1, 4, 2, 1, 2, "10.0.0.5", 29400),
        ),
        # A loopback master means one node, so LOCAL_WORLD_SIZE can be left out.
        (
            {
                "RANK": "1",
                "WORLD_SIZE": "3",
                "LOCAL_RANK": "1",
                "MASTER_ADDR": "localhost",
                "MASTER_PORT": "29500",
            },
            expect("env", 1, 1, 3, 3, 0, 1, "localhost", 29500),
        ),
        ({"RANK": "0", "WORLD_SIZE": "1"}, expect("env", 0, 0, 1, 1, 0, 1, "127.0.0.1", 29500)),
    ],
    ids=["one-per-node", "two-per-node", "explicit-node-rank", "loopback", "world-of-one"],
)
def test_manual_environments(env: dict[str, str], expected: dict[str, object]) -> None:
    assert topology(detect(env)) == expected


def test_defaulted_port_is_noted() -> None:
    assert detect({"RANK": "0", "WORLD_SIZE": "1"}).notes == ("MASTER_PORT not set, using 29500",)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0"}, "RANK='0' is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE='2' is set but RANK is not"),
        (NODE | {"RANK": "2"}, "RANK=2 must be less than WORLD_SIZE=2"),
        (NODE | {"RANK": "-1"}, "RANK=-1 must be at least 0"),
        (NODE | {"RANK": "one"}, "RANK='one' is not an integer"),
        (NODE | {"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
        (NODE | {"RANK": "1.0"}, r"RANK='1.0' is not an integer"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "WORLD_SIZE=2 spans 2 nodes but MASTER_ADDR is not set"),
        (NODE | {"LOCAL_RANK": "0"}, "LOCAL_RANK='0' is set but LOCAL_WORLD_SIZE is not"),
        (
            NODE | {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3"},
            "LOCAL_WORLD_SIZE=3 is larger than WORLD_SIZE=2",
        ),
        (
            NODE | {"WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
            "WORLD_SIZE=3 is not a multiple of LOCAL_WORLD_SIZE=2",
        ),
        (NODE | {"MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
    ],
)
def test_bad_manual_environments(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        detect(env)
