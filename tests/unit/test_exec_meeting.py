"""Which exec'd processes meet at the master first, and what their job agrees on."""

from __future__ import annotations

import dataclasses

import pytest

from trainbox.launch import HostFacts, detect
from trainbox.runtime import exec_meeting

from launchcase import srun_task

TASK = srun_task(procid=1, localid=1, nodeid=0, tasks=2, nodes=1, tasks_per_node="2", nodelist="n1")
CONTEXT = detect(TASK, HostFacts())


@pytest.mark.parametrize(
    ("change", "needed"),
    [
        ({}, True),
        ({"world_size": 1, "rank": 0, "local_world_size": 1, "local_rank": 0}, False),
        # torchrun's agent already listens on MASTER_PORT.
        ({"launcher": "torchrun"}, False),
        # Node mode: torchrun's agent meets the other nodes.
        ({"spawns_workers": True}, False),
    ],
)
def test_who_meets_before_the_command(change: dict[str, object], needed: bool) -> None:
    assert exec_meeting.needed(dataclasses.replace(CONTEXT, **change)) is needed  # type: ignore[arg-type]


def test_the_job_tag_names_the_slurm_step_and_the_world() -> None:
    assert exec_meeting.job_tag(TASK, CONTEXT) == "trainbox-exec:world=2:9:0"


def test_ranks_that_disagree_on_the_world_have_different_tags() -> None:
    other = dataclasses.replace(CONTEXT, world_size=4)
    assert exec_meeting.job_tag(TASK, other) != exec_meeting.job_tag(TASK, CONTEXT)
