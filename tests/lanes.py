"""pytest-xdist's `--dist loadgroup` with one worker kept for the system group.

The system group (tests/conftest.py) runs whole on one worker: Slurm jobs, podman builds and
pods, whose processes wait part of the time on the scheduler, the registry and the disk. On 2
cores a second worker beside it is not enough to keep both cores busy, and a third that also took
training runs after the group would put three CPU-bound workers on two cores. So with three or
more workers the last one takes the system group and nothing else, and the others take the
rest, never the system group: at most two CPU-bound workers, and the waiting group beside them.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadGroupScheduling

# Fewer workers than this keep loadgroup's plain behaviour: one worker cannot be spared.
LANE_FROM_WORKERS = 3


class SystemLaneScheduling(LoadGroupScheduling):
    """Loadgroup scheduling where one worker runs the system group and only that."""

    def __init__(self, config: Any, log: Any = None, *, group: str) -> None:
        super().__init__(config, log)
        # The xdist group of the tests that share the machine (tests/conftest.py).
        self._group = group
        # The worker kept for that group; None until scheduling starts, or without one.
        self._lane: Any = None

    def schedule(self) -> None:
        if self.collection is None and len(self.nodes) >= LANE_FROM_WORKERS:
            self._lane = self.nodes[-1]
        super().schedule()

    def _assign_work_unit(self, node: Any) -> None:
        """Send `node` the first unit it may run; shut it down when none is left for it (it then
        runs what it holds and stops)."""
        lane = self._active_lane()
        scope = eligible_scope(
            list(self.workqueue), self._group, is_lane=node is lane, has_lane=lane is not None
        )
        if scope is None:
            # No unit will become this worker's (the queue only shrinks; a crashed worker's unit
            # goes back with xdist's replacement worker to take it), so it is told now: a worker
            # holds its last test until it knows the next (pytest's `nextitem`), and would
            # otherwise sit on it until the other workers had drained the whole queue.
            node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some(
            [collection.index(nodeid) for nodeid, done in work_unit.items() if not done]
        )

    def _active_lane(self) -> Any:
        """The lane worker while it is alive; None once it is gone (a crash), so no unit is
        left that no worker would take."""
        return self._lane if self._lane in self.assigned_work else None


def eligible_scope(queue: list[str], group: str, *, is_lane: bool, has_lane: bool) -> str | None:
    """The first unit of `queue` this worker may run, or None: with a lane, `group` is the
    lane's alone and the lane takes nothing else."""
    for scope in queue:
        if not has_lane or (scope == group) == is_lane:
            return scope
    return None
