"""`trainbox run`: train from the config's factories, here or in node mode's workers; at the end,
what ran, where its files are, and the exact commands to go on from it (train longer,
evaluate, plot)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from trainbox import config
from trainbox.commands import flags
from trainbox.commands.command import Command
from trainbox.config.loading import CALLABLE_FIELDS, FACTORY_PATTERN
from trainbox.errors import Stopped
from trainbox.process import bootstrap, launching, preempt


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
        dist=settings.dist,
        work=lambda: _train(settings, prepared, requests, env, own_process=args.own_process),
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    flags.config_flag(parser)
    flags.debug_flag(parser)


COMMAND = Command(
    name="run", arguments=_arguments, handler=main, overrides=True, epilog=flags.CONFIG_EPILOG,
    help="train (the image's default command)",
)  # fmt: skip


def _gloo(settings: config.Config, prepared: bootstrap.StartupFacts) -> bool:
    """Whether this job's process group is gloo (dist.choose_backend, without importing torch)."""
    backend = settings.dist.backend
    return backend == "gloo" or (backend == "auto" and not prepared.survey.gpus)


def _train(
    settings: config.Config,
    prepared: bootstrap.StartupFacts,
    requests: preempt.StopRequests,
    env: Mapping[str, str],
    *,
    own_process: bool,
) -> int:
    from trainbox.runtime import trainer  # torch loads only for commands that train

    launching.freeze_start_up(own_process=own_process)
    summary = trainer.train(settings, prepared, requests=requests)
    if prepared.context.rank == 0:
        rerun = rerun_facts(settings, env, cwd=Path.cwd())
        show(summary.as_dict(), settings.output_dir, rerun=rerun)
    return 0


# `trainbox report` draws with matplotlib, which only the plot extra installs.
PLOT_EXTRA = "pip install 'trainbox[plot]', then: "
# A checkpoint's file or folder name holds its step (step-00003000.pt, step-00003000.dcp).
STEP_IN_NAME = re.compile(r"step-(\d+)")
# Said in place of the metrics, and of an eval that would have nothing to read.
NO_VALIDATION = "no validation set"


@dataclass(frozen=True, kw_only=True, slots=True)
class Rerun:
    """What the next commands need beyond the run's directory, and where the run started."""

    # The run's PYTHONPATH when its own code was imported from there; None: from elsewhere.
    pythonpath: str | None = None
    # The run's train.resume, which its config.yaml keeps.
    resume: str = "auto"
    # The step the run resumed from (the checkpoint's path when its name has none); None: 0.
    resumed_from: int | str | None = None
    # run_dir's s3:// URL, which the next commands name; None: run_dir is a path.
    store_url: str | None = None


def lines(
    summary: Mapping[str, Any],
    run_dir: Path,
    *,
    can_plot: bool = True,
    rerun: Rerun | None = None,
) -> list[str]:
    """The summary as lines for a person (pure: the run's summary dict, its directory, whether
    `trainbox report` can draw here, i.e. matplotlib is installed, and what a rerun needs).

    The first line keeps the shape scripts grep for: `trained N steps: key=value ... -> FILE`.
    """
    rerun = rerun or Rerun()
    # A run kept in a store is named by its URL; its working copy here only caches it.
    shown = rerun.store_url or str(run_dir)
    where, steps, val = shlex.quote(shown), summary["steps"], summary["val_metrics"]
    metrics = " ".join(f"{key}={_num(value)}" for key, value in val.items()) or NO_VALIDATION
    done = "already complete at step" if summary.get("already_complete") else "trained"
    head = [f"{done} {steps}{'' if done != 'trained' else ' steps'}: {metrics} -> "
            f"{shown}/summary.json"]  # fmt: skip
    if not summary.get("already_complete"):
        head.append(_what_ran(summary, rerun.resumed_from))
    return [
        *head,
        f"  outputs:       {shown}/ (metrics.jsonl, config.yaml, run.json, checkpoints/)",
        *_next_commands(run_dir, steps=steps, validated=bool(val), rerun=rerun),
        f"  plot:          {'' if can_plot else PLOT_EXTRA}trainbox report {where}",
    ]


def _next_commands(run_dir: Path, *, steps: int, validated: bool, rerun: Rerun) -> list[str]:
    """Train longer, evaluate and predict, as they run from here: with the PYTHONPATH the
    user's code came from, and only what the run's data can answer."""
    # --config reads a local file: a stored run's config.yaml is in its working copy here.
    where = shlex.quote(rerun.store_url or str(run_dir))
    resolved = shlex.quote(str(run_dir / "config.yaml"))
    env = f"PYTHONPATH={shlex.quote(rerun.pythonpath)} " if rerun.pythonpath else ""
    # config.yaml keeps the run's train.resume: `never` would refuse its checkpoints, a file
    # would start over from that file.
    resume = "" if rerun.resume == "auto" else " train.resume=auto"
    evaluate = f"{env}trainbox eval --checkpoint {where}"
    if not validated:
        evaluate = f"{NO_VALIDATION}: the data factory returns none to evaluate on"
    split = "" if validated else " --split train"
    return [
        f"  train longer:  {env}trainbox run --config {resolved} run_dir={where}"
        f" train.max_steps={2 * steps}{resume}",
        f"  evaluate:      {evaluate}",
        f"  predict:       {env}trainbox predict --checkpoint {where} --output predictions.csv"
        f"{split}",
    ]


def _what_ran(summary: Mapping[str, Any], resumed_from: int | str | None) -> str:
    parts = [] if resumed_from is None else [_resumed(resumed_from, summary["steps"])]
    parts.append(f"final loss {_num(summary.get('final_loss'))}")
    seconds, rate = summary.get("train_seconds"), summary.get("samples_per_s")
    if isinstance(seconds, float) and math.isfinite(seconds):
        parts.append(f"{_duration(seconds)} of training")
    if isinstance(rate, float) and math.isfinite(rate):
        parts.append(f"{_num(rate)} samples/s")
    if summary.get("world_size"):
        parts.append(f"{summary['world_size']} process(es) under {summary.get('launcher')}")
    return "  ran:           " + ", ".join(parts)


def _resumed(resumed_from: int | str, steps: int) -> str:
    # The time and rate that follow are of this call's steps only, so say how many those were.
    if isinstance(resumed_from, str):
        return f"resumed from {resumed_from}"
    more = f" ({steps - resumed_from} more steps)" if steps > resumed_from else ""
    return f"resumed from step {resumed_from}{more}"


def show(
    summary: Mapping[str, Any],
    run_dir: Path,
    *,
    rerun: Rerun | None = None,
    stream: TextIO | None = None,
) -> None:
    """Print the summary (the command's own output: stdout)."""
    can_plot = importlib.util.find_spec("matplotlib") is not None
    text = lines(summary, run_dir, can_plot=can_plot, rerun=rerun)
    print("\n".join(text), file=stream or sys.stdout)


def rerun_facts(settings: config.Config, env: Mapping[str, str], *, cwd: Path) -> Rerun:
    """What this finished run's next commands need: read from its run.json, its config and
    where its code was imported from."""
    pythonpath = env.get("PYTHONPATH", "")
    from_path = code_from_pythonpath(_code_origins(settings), pythonpath, cwd)
    return Rerun(
        pythonpath=pythonpath if from_path else None,
        resume=settings.train.resume,
        resumed_from=resumed_from(_recorded_start(settings.output_dir)),
        store_url=settings.store.url if settings.store else None,
    )


def code_from_pythonpath(origins: Iterable[Path], pythonpath: str, cwd: Path) -> bool:
    """Whether any of the user's modules (a file or package folder) lies in a PYTHONPATH entry,
    a relative entry being read from `cwd` as Python reads it."""
    entries = [
        Path(os.path.normpath(cwd / entry)) for entry in pythonpath.split(os.pathsep) if entry
    ]
    return any(
        Path(os.path.normpath(cwd / origin)).is_relative_to(entry)
        for origin in origins
        for entry in entries
    )


def resumed_from(source: str | None) -> int | str | None:
    """The step of the checkpoint a run resumed from (its path when its name holds no step)."""
    if source is None:
        return None
    found = STEP_IN_NAME.fullmatch(Path(source).stem)
    return int(found[1]) if found else source


def _recorded_start(run_dir: Path) -> str | None:
    """run.json's resumed_from: the checkpoint this run started from, or None."""
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    source = record.get("resumed_from") if isinstance(record, dict) else None
    return source if isinstance(source, str) else None


def _code_origins(settings: config.Config) -> list[Path]:
    """Where the top-level modules of the user's code that the config names were imported from
    (trainbox's own left out: it is found wherever trainbox is)."""
    found = []
    for module in sorted({path.partition(":")[0].split(".")[0] for path in _code_paths(settings)}):
        try:
            spec = None if module == "trainbox" else importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.has_location and spec.origin:
            found.append(Path(spec.origin))
        found.extend(Path(folder) for folder in spec.submodule_search_locations or ())
    return found


def _code_paths(settings: config.Config) -> Iterator[str]:
    """Every `module:function` the config names as user code (factories, steps, ...)."""

    def walk(data: Mapping[str, Any]) -> Iterator[str]:
        for key, value in data.items():
            if isinstance(value, Mapping):
                yield from walk(value)
            elif (
                key in CALLABLE_FIELDS
                and isinstance(value, str)
                and FACTORY_PATTERN.fullmatch(value)
            ):
                yield value

    yield from walk(config.as_dict(settings))


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
