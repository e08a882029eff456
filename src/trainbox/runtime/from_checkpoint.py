"""What eval and predict share: a checkpoint located, its config, then work on every rank."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainbox import config, logs
from trainbox.distributed.consensus import Problem, combined
from trainbox.infer import locate
from trainbox.process import launching

if TYPE_CHECKING:
    from trainbox.distributed.process_group import Session


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """An eval or predict command's own part of the shared path."""

    # What the ranks do, for the message when a peer is lost ("evaluation").
    label: str
    # Every rank's work in the joined group: the result rank 0 prints.
    compute: Callable[[config.Config, Session, Path], dict[str, Any]]
    # Rank 0's one line about the result, printed after the group is left.
    say: Callable[[dict[str, Any]], str]


def main(args: argparse.Namespace, env: Mapping[str, str], job: Job) -> int:
    """StartupFacts and launched exactly like `run`, then `job` on every rank."""
    checkpoint = locate.checkpoint_path(args.checkpoint)
    output = Path(args.output) if args.output else None
    predict = args.command == "predict"
    # Files first: a usage error is said at once, not after joining the peers.
    _raise_problems(locate.early_problems(checkpoint, output, predict=predict))
    settings, source = locate.settings(checkpoint, args.config, args.overrides)
    prepared = launching.prepare(env, settings)
    context = prepared.context
    hosts_rank0 = context.rank == 0 or (context.spawns_workers and context.node_rank == 0)
    if hosts_rank0 and output is not None:
        _raise_problems(locate.destination_problems(output, force=args.force))
    logs.log.info("config", source=source or "defaults", checkpoint=str(checkpoint))
    prepared.preflight.raise_if_fatal()

    def work() -> int:
        from trainbox.runtime import group  # torch loads only now, after pinning

        launching.freeze_start_up(own_process=args.own_process)
        with group.joined(settings, prepared, work=job.label) as session:
            result = job.compute(settings, session, checkpoint)
        if context.rank == 0:
            print(job.say(result))
        return 0

    return launching.launch(
        prepared,
        env,
        argv=args.argv,
        # No DDP in eval or predict: DETAIL's collective checks are safe on gloo too.
        extra=launching.debugging(args.debug, env, prepared),
        max_restarts=settings.dist.max_restarts,
        # No deadline: a stopped prediction simply resumes from its parts when rerun.
        deadline_at=None,
        work=work,
    )


def _raise_problems(found: list[Problem]) -> None:
    """All the problems found as one UsageError, or nothing."""
    error = combined(found)
    if error is not None:
        raise error
