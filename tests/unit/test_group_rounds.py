"""Each round of a torchrun worker group keys the shared store apart from every other round."""

from __future__ import annotations

import pytest

from trainbox.distributed.process_group import attempt

# (what happened, the workers' environment, the round's label)
ROUNDS = [
    ("outside torchrun", {}, "0-w1"),
    ("first start of 2", {"TORCHELASTIC_RESTART_COUNT": "0", "WORLD_SIZE": "2"}, "0-w2"),
    # A peer lost: torchrun counts a restart, and the survivors re-form smaller.
    ("after a leave", {"TORCHELASTIC_RESTART_COUNT": "1", "WORLD_SIZE": "1"}, "1-w1"),
    # A node joined: torchrun re-forms without counting a restart, into a larger world.
    ("after a join", {"TORCHELASTIC_RESTART_COUNT": "1", "WORLD_SIZE": "2"}, "1-w2"),
    ("empty values", {"TORCHELASTIC_RESTART_COUNT": "", "WORLD_SIZE": ""}, "0-w1"),
]


@pytest.mark.parametrize(("case", "env", "label"), ROUNDS, ids=[row[0] for row in ROUNDS])
def test_round_label(case: str, env: dict[str, str], label: str) -> None:
    assert attempt(env) == label, case


def test_a_leave_then_a_join_never_reuses_an_earlier_rounds_keys() -> None:
    labels = [attempt(env) for _, env, _ in ROUNDS[1:4]]
    assert len(set(labels)) == len(labels)
