"""`trainbox run`: train from the config's factories, here or in node mode's workers."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from trainbox import config
from trainbox.commands import launching, run_summary
from trainbox.errors import Stopped
from trainbox.process import bootstrap, preempt


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Prepare, then train here or supervise the workers that do; 0 when training finished."""
    # First thing: a preemption signal during start-up must not kill the process uncounted.
    requests = preempt.StopRequests()
    requests.install()
    settings = config.load(args.config, args.overrides)
    prepared = launching.prepare(env, settings)
    prepared.preflight.raise_if_fatal()
    # The trainer wraps the model in DDP.
    extra = launching.debugging(args.debug, env, prepared, ddp_over_gloo=_gloo(settings, prepared))
    deadline_at = None
    if prepared.context.spawns_workers:
        deadline_at = preempt.deadline(env, margin_s=settings.train.deadline_margin_s)
        if requests.code:
            # Asked to stop before any worker started: nothing new to save.
            raise Stopped(
                f"stopped by {preempt.REASONS[requests.code]} before the workers started",
                hint="run the same command again; it resumes from the newest checkpoint",
            )
    return launching.launch(
        prepared,
        env,
        argv=args.argv,
        extra=extra,
        max_restarts=settings.dist.max_restarts,
        deadline_at=deadline_at,
        work=lambda: _train(settings, prepared, requests),
    )


def _gloo(settings: config.Config, prepared: bootstrap.StartupFacts) -> bool:
    """Whether this job's process group is gloo (dist.choose_backend, without importing torch)."""
    backend = settings.dist.backend
    return backend == "gloo" or (backend == "auto" and not prepared.survey.gpus)


def _train(
    settings: config.Config, prepared: bootstrap.StartupFacts, requests: preempt.StopRequests
) -> int:
    from trainbox.runtime import trainer  # torch loads only for commands that train

    summary = trainer.train(settings, prepared, requests=requests)
    if prepared.context.rank == 0:
        run_summary.show(summary.as_dict(), settings.output_dir)
    return 0
