"""train.strategy=hsdp: the (replicate, shard) mesh shape chosen from the world, the ranks per
node and train.shard_size, and every reason it is refused, in one error."""

from __future__ import annotations

import pytest

from trainbox import config
from trainbox.config import ConfigError
from trainbox.errors import UsageError
from trainbox.launch.context import LaunchContext
from trainbox.train.parallel.mesh import hsdp_mesh_shape, mesh_shape, node_major
from trainbox.train.resume.policy import judge_resume

# (world_size, local_world_size, shard_size) -> (replicate, shard)
SHAPES = [
    pytest.param(16, 8, 0, (2, 8), id="0-means-one-node"),
    pytest.param(16, 8, 4, (4, 4), id="shard-divides-a-node"),
    pytest.param(32, 8, 16, (2, 16), id="shard-spans-whole-nodes"),
    pytest.param(16, 8, 16, (1, 16), id="shard-is-the-world"),
    pytest.param(4, 4, 2, (2, 2), id="one-node-two-groups"),
    pytest.param(8, 8, 1, (8, 1), id="shard-of-one-is-replication"),
]


@pytest.mark.parametrize(("world", "local", "shard_size", "shape"), SHAPES)
def test_the_mesh_shape(world: int, local: int, shard_size: int, shape: tuple[int, int]) -> None:
    assert hsdp_mesh_shape(world, local, shard_size) == shape


# (world_size, local_world_size, shard_size) -> what the one problem says
REFUSED = [
    pytest.param(16, 8, -1, "needs at least one rank", id="below-one"),
    pytest.param(16, 8, 32, "more than the world size of 16", id="more-than-the-world"),
    pytest.param(24, 8, 16, "does not divide the world size of 24", id="not-dividing-world"),
    pytest.param(24, 8, 12, "span nodes of 8 ranks unevenly", id="uneven-across-nodes"),
]


@pytest.mark.parametrize(("world", "local", "shard_size", "says"), REFUSED)
def test_a_bad_shard_size_is_refused_with_its_reason(
    world: int, local: int, shard_size: int, says: str
) -> None:
    with pytest.raises(UsageError) as caught:
        hsdp_mesh_shape(world, local, shard_size)
    [problem] = caught.value.problems
    assert problem.startswith("train.strategy=hsdp: ")
    assert says in problem
    assert caught.value.exit_code == 2
    assert "train.shard_size" in caught.value.hint


def test_every_problem_comes_in_one_error() -> None:
    # 6 does not divide 16, and groups of 6 straddle nodes of 4.
    with pytest.raises(UsageError) as caught:
        hsdp_mesh_shape(16, 4, 6)
    assert len(caught.value.problems) == 2


def test_the_default_shard_size_is_named_as_the_nodes_ranks() -> None:
    # 5 ranks per node (0: one node's ranks) cannot tile a world of 8.
    with pytest.raises(UsageError) as caught:
        hsdp_mesh_shape(8, 5, 0)
    assert caught.value.problems == ["train.strategy=hsdp: 5 ranks per node does not divide"
                                     " the world size of 8"]  # fmt: skip


@pytest.mark.parametrize(("strategy", "shape"), [("ddp", None), ("fsdp", (8,)), ("hsdp", (2, 4))])
def test_each_strategy_has_its_mesh(strategy: str, shape: tuple[int, ...] | None) -> None:
    train = config.load(None, [f"train.strategy={strategy}"]).train
    assert mesh_shape(train, world_size=8, local_world_size=4) == shape
    assert train.sharded is (strategy != "ddp")


def test_hsdp_is_refused_with_what_fsdp_refuses() -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(None, ["train.strategy=hsdp", "train.find_unused_parameters=true"])
    [problem] = caught.value.problems
    assert problem.startswith("train.find_unused_parameters=true is not supported with"
                              " train.strategy=hsdp (")  # fmt: skip


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_shard_size_without_hsdp_is_refused_at_load(strategy: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(None, [f"train.strategy={strategy}", "train.shard_size=2"])
    [problem] = caught.value.problems
    assert problem.startswith(f"train.shard_size=2 means nothing with train.strategy={strategy}")
    assert "hsdp" in caught.value.hint


def test_a_negative_shard_size_is_refused_at_load() -> None:
    with pytest.raises(ConfigError):
        config.load(None, ["train.shard_size=-1"])


@pytest.mark.parametrize(
    ("was", "now", "refused"),
    [("fsdp", "hsdp", False), ("hsdp", "fsdp", False), ("hsdp", "ddp", True)],
)
def test_a_resume_moves_between_the_sharded_strategies_freely(
    was: str, now: str, refused: bool
) -> None:
    old = {"train": {"strategy": was, "shard_size": 2}}
    new = {"train": {"strategy": now, "shard_size": 0}}
    assert bool(judge_resume(old, new)) is refused


@pytest.mark.parametrize(
    ("rank", "node_rank", "local_rank", "consecutive"),
    [(5, 1, 1, True), (0, 0, 0, True), (1, 1, 0, False), (4, 0, 2, False)],
)
def test_a_rank_out_of_node_order_is_noticed(
    rank: int, node_rank: int, local_rank: int, consecutive: bool
) -> None:
    # Two nodes of four ranks: node-major puts rank 5 on node 1 as its local rank 1.
    context = LaunchContext(launcher="env", flavor="", rank=rank, local_rank=local_rank,
                            world_size=8, local_world_size=4, node_rank=node_rank, num_nodes=2,
                            master_addr="h", master_port=1)  # fmt: skip
    assert node_major(context) is consecutive
