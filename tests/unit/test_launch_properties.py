"""Over random environments, detection gives a consistent context or raises LaunchError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainbox.errors import LaunchError
from trainbox.launch import HostFacts, detect

from launchenv import NAMES, VALUES


@settings(max_examples=1500, deadline=None)
@given(
    env=st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=14),
    gpus=st.integers(min_value=0, max_value=8),
    hostfile_head=st.one_of(st.none(), st.just("h1")),
)
def test_detect_returns_a_consistent_context_or_raises_launch_error(
    env: dict[str, str], gpus: int, hostfile_head: str | None
) -> None:
    try:
        context = detect(env, HostFacts(visible_gpus=gpus, slurm_hostfile_head=hostfile_head))
    except LaunchError as err:
        error = err
    else:
        error = None
    if error is not None:
        assert error.problems
        assert error.hint
        return
    assert 0 <= context.rank < context.world_size
    assert 0 <= context.local_rank < context.local_world_size <= context.world_size
    assert 0 <= context.node_rank < context.num_nodes
    assert context.master_addr
    assert 0 <= context.master_port < 65536
    assert all(isinstance(value, str) for value in context.to_env().values())
