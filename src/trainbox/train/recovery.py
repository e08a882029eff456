"""dist.recovery=in_process, the loop's side: after a rank is lost, leave the broken group, form the
next generation with its spare, take the furthest survivor's state, and say what it cost.

The loop calls `rejoin` where it would otherwise fail (a collective that lost a peer) and where a
promoted spare starts; `recovered` after the first step that follows, which writes one
`kind: recovery` record per lost rank to metrics.jsonl (rank 0).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainbox.distributed.regroup import MOST_ATTEMPTS, Generations
from trainbox.errors import DistributedError
from trainbox.logs import log
from trainbox.process import bad_nodes
from trainbox.process.keeper import Promotion
from trainbox.train.resume.handover import Handover, hand_over
from trainbox.train.resume.state import TrainState
from trainbox.watchdog import is_comm_failure, short_error


@dataclass(frozen=True, kw_only=True, slots=True)
class Rejoined:
    """One recovery, as every rank agreed it."""

    # The generation the group now is.
    generation: int
    # What the hand-over agreed: the step, its source, the steps trained again.
    handover: Handover
    # Epoch seconds when this rank found the group broken (a spare: when its keeper saw the
    # trainer it replaces die).
    detected_at: float


class Recovery:
    """One rank's part in in-process recovery."""

    def __init__(
        self,
        generations: Generations,
        *,
        rank: int,
        world_size: int,
        promotion: Promotion | None,
        record: Callable[[dict[str, Any]], None],
    ) -> None:
        self.generations, self.rank, self.world_size = generations, rank, world_size
        # A promoted spare's news, until its first recovery is done (then it is a survivor).
        self.promotion = promotion
        self.record = record
        # The recovery whose first step has not yet been taken.
        self.pending: Rejoined | None = None

    @staticmethod
    def recoverable(err: BaseException) -> bool:
        """Whether `err` is a lost peer or a broken group, which a new generation mends."""
        return isinstance(err, RuntimeError) and is_comm_failure(err)

    def rejoin(
        self,
        state: TrainState,
        *,
        in_flight: int,
        mark: Callable[[str, int], None],
        fault: Callable[[str], None],
    ) -> None:
        """Collective over the new generation: leave the broken group (a spare has none), join
        the next, take the furthest survivor's state. Raises DistributedError when that fails
        MOST_ATTEMPTS times in a row."""
        joining = self.promotion is not None
        detected = self.promotion.died_at if self.promotion else time.time()
        if not joining:
            log.warning("a peer was lost: re-forming the group", step=state.step)
        for attempt in range(MOST_ATTEMPTS):
            mark("re-forming the process group", state.step)
            try:
                if not joining or attempt:
                    self.generations.leave()
                    self.generations.join(
                        self.generations.current + 1,
                        waiting=lambda: mark("re-forming the process group", state.step),
                    )
                if joining and self.promotion is not None:
                    self._announce(self.promotion)
                fault("handover")
                handed = hand_over(
                    state, joining=joining, in_flight=in_flight, rank=self.rank,
                    world_size=self.world_size,
                )  # fmt: skip
            except RuntimeError as err:
                if not self.recoverable(err):
                    raise
                log.warning(
                    "re-forming failed: trying the next generation", error=short_error(str(err))
                )
                continue
            # From here on this process is one of the survivors.
            self.promotion = None
            self.pending = Rejoined(
                generation=self.generations.current, handover=handed, detected_at=detected
            )
            log.info("group re-formed", generation=self.generations.current, step=handed.step,
                     source=handed.source, steps_lost=handed.steps_lost)  # fmt: skip
            return
        raise DistributedError(
            f"rank {self.rank} could not re-form the process group in {MOST_ATTEMPTS} tries",
            hint="the run resumes from its newest checkpoint when started again",
        )

    def recovered(self, step: int) -> None:
        """The first step after a recovery is done: rank 0 records it."""
        pending, self.pending = self.pending, None
        if pending is None or self.rank != 0:
            return
        now = time.time()
        lost = in_order_of_death(
            self.generations.announcements(pending.generation), pending.detected_at
        )
        for news in lost:
            self.record({
                "kind": "recovery", "step": step, "generation": pending.generation,
                "rank": news.get("rank"), "node": news.get("node"),
                "cause": news.get("cause", "lost peer"),
                "seconds": round(now - _died_at(news, pending.detected_at), 3),
                "steps_retrained": pending.handover.steps_lost, "time": now,
            })  # fmt: skip
        self.generations.count_recoveries(len(lost))
        seconds = round(now - _died_at(lost[0], pending.detected_at), 3)
        log.warning(
            "recovered", step=step, lost=[news.get("rank") for news in lost], seconds=seconds
        )

    def _announce(self, promotion: Promotion) -> None:
        """A spare's news for rank 0's record: which rank it replaced, where, and why."""
        news = {
            "rank": self.rank,
            "node": bad_nodes.node_name(os.environ),
            "cause": promotion.cause,
            "died_at": promotion.died_at,
            "pid": os.getpid(),
        }
        self.generations.announce(json.dumps(news))


def in_order_of_death(joined: list[dict[str, Any]], broke_at: float) -> list[dict[str, Any]]:
    """The spares' news ordered by when the rank each replaced died, then by rank; spares join
    in whatever order they are scheduled, so that order says nothing. No news: one lost peer."""
    if not joined:
        return [{}]
    return sorted(joined, key=lambda news: (_died_at(news, broke_at), news.get("rank") or 0))


def _died_at(news: dict[str, object], otherwise: float) -> float:
    """When the replaced rank died, by its keeper's clock (`otherwise`: when the group broke)."""
    died = news.get("died_at")
    return float(died) if isinstance(died, int | float) else otherwise
