"""`trainbox run`: train from the config's factories, here or in node mode's workers; at the end,
what ran, where its files are, and the exact commands to go on from it (train longer,
evaluate, plot)."""

from __future__ import annotations

import argparse
import importlib.util
import math
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from trainbox import config
from trainbox.commands import launching
from trainbox.errors import Stopped
from trainbox.process import bootstrap, preempt


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Prepare, then train here or supervise the workers that do; 0 when training finished."""
    # First thing: a preemption signal during start-up must not kill the process uncounted.
    requests = preempt.StopRequests()
    requests.install()
    settings = config.load(args.config, args.overrides)
    prepared = launching.prepare(env, settings)
    launching.check_node(prepared, env, run_dir=settings.output_dir)
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
        work=lambda: _train(settings, prepared, requests, own_process=args.own_process),
    )


def _gloo(settings: config.Config, prepared: bootstrap.StartupFacts) -> bool:
    """Whether this job's process group is gloo (dist.choose_backend, without importing torch)."""
    backend = settings.dist.backend
    return backend == "gloo" or (backend == "auto" and not prepared.survey.gpus)


def _train(
    settings: config.Config,
    prepared: bootstrap.StartupFacts,
    requests: preempt.StopRequests,
    *,
    own_process: bool,
) -> int:
    from trainbox.runtime import trainer  # torch loads only for commands that train

    launching.freeze_start_up(own_process=own_process)
    summary = trainer.train(settings, prepared, requests=requests)
    if prepared.context.rank == 0:
        show(summary.as_dict(), settings.output_dir)
    return 0


# `trainbox report` draws with matplotlib, which only the plot extra installs.
PLOT_EXTRA = "pip install 'trainbox[plot]', then: "


def lines(summary: Mapping[str, Any], run_dir: Path, *, can_plot: bool = True) -> list[str]:
    """The summary as lines for a person (pure: the run's summary dict, its directory, and
    whether `trainbox report` can draw here, i.e. matplotlib is installed).

    The first line keeps the shape scripts grep for: `trained N steps: key=value ... -> FILE`.
    """
    where, steps = shlex.quote(str(run_dir)), summary["steps"]
    metrics = " ".join(f"{key}={_num(value)}" for key, value in summary["val_metrics"].items())
    done = "already complete at step" if summary.get("already_complete") else "trained"
    head = [f"{done} {steps}{'' if done != 'trained' else ' steps'}: {metrics} -> "
            f"{run_dir / 'summary.json'}"]  # fmt: skip
    if not summary.get("already_complete"):
        head.append(_what_ran(summary))
    config = shlex.quote(str(run_dir / "config.yaml"))
    return [
        *head,
        f"  outputs:       {run_dir}/ (metrics.jsonl, config.yaml, run.json, checkpoints/)",
        f"  train longer:  trainbox run --config {config} run_dir={where}"
        f" train.max_steps={2 * steps}",
        f"  evaluate:      trainbox eval --checkpoint {where}",
        f"  predict:       trainbox predict --checkpoint {where} --output predictions.csv",
        f"  plot:          {'' if can_plot else PLOT_EXTRA}trainbox report {where}",
    ]


def _what_ran(summary: Mapping[str, Any]) -> str:
    parts = [f"final loss {_num(summary.get('final_loss'))}"]
    seconds, rate = summary.get("train_seconds"), summary.get("samples_per_s")
    if isinstance(seconds, float) and math.isfinite(seconds):
        parts.append(f"{_duration(seconds)} of training")
    if isinstance(rate, float) and math.isfinite(rate):
        parts.append(f"{_num(rate)} samples/s")
    if summary.get("world_size"):
        parts.append(f"{summary['world_size']} process(es) under {summary.get('launcher')}")
    return "  ran:           " + ", ".join(parts)


def show(
    summary: Mapping[str, Any],
    run_dir: Path,
    *,
    stream: TextIO | None = None,
) -> None:
    """Print the summary (the command's own output: stdout)."""
    can_plot = importlib.util.find_spec("matplotlib") is not None
    text = lines(summary, run_dir, can_plot=can_plot)
    print("\n".join(text), file=stream or sys.stdout)


def _num(value: Any) -> str:
    if isinstance(value, float) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"
