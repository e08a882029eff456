"""The path every working command takes: prepare, then supervise the workers or pin and work."""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path

from trainbox import affinity, config, logs, preflight
from trainbox.config.preflight_checks import STORE_CHECKS
from trainbox.errors import PreflightError, UsageError
from trainbox.process import bad_nodes, bootstrap, caches, exec_plan, keeper, preempt, supervise
from trainbox.process.debug import debug_env


def prepare(
    env: Mapping[str, str], settings: config.Config, *, whole_node: bool = False
) -> bootstrap.StartupFacts:
    """bootstrap.startup_facts (survey, detect, judge and plan), and log what was found."""
    prepared = bootstrap.startup_facts(env, settings, whole_node=whole_node)
    context = prepared.context
    logs.bind(context)
    logs.log.info(
        "launch",
        flavor=context.flavor,
        world_size=context.world_size,
        node_rank=context.node_rank,
        master=f"{context.master_addr}:{context.master_port}",
        spawns_workers=context.spawns_workers,
    )
    for note in context.notes:
        logs.log.warning("launch note", note=note)
    for check in prepared.preflight.describe():
        if check["status"] in ("warn", "fail") and preflight.worth_logging(
            check["name"], local_rank=context.local_rank
        ):
            logs.log.warning("preflight", **check)
    return prepared


def check_node(prepared: bootstrap.StartupFacts, env: Mapping[str, str], *, run_dir: Path) -> None:
    """Preflight's fatal findings end this rank (exit 3), recorded once per node in run_dir."""
    try:
        prepared.preflight.raise_if_fatal()
    except PreflightError as err:
        # Every rank of the node judges the same node; its local rank 0 (node mode's one
        # process) records it, so a node of eight ranks writes one file, not eight.
        # A store that refuses us is not the node's fault: it is not recorded as a bad node,
        # and a record could not reach the store anyway.
        node_at_fault = any(check.name not in STORE_CHECKS for check in prepared.preflight.fatal)
        if prepared.context.local_rank == 0 and node_at_fault:
            record = bad_nodes.event(
                env, reason=bad_nodes.PREFLIGHT, detail="; ".join(err.problems),
                exit_code=err.exit_code, rank=prepared.context.rank, now=time.time(),
            )  # fmt: skip
            bad_nodes.write(run_dir, record)
        here = bad_nodes.node_name(env)
        cordon = bad_nodes.cordon_hint(here, env, flavor=prepared.context.flavor)
        if not cordon:
            raise
        raise PreflightError(err.problems, hint=err.hint + cordon) from err


def debugging(
    debug: bool,
    env: Mapping[str, str],
    prepared: bootstrap.StartupFacts,
    *,
    ddp_over_gloo: bool = False,
) -> dict[str, str]:
    """The variables --debug adds (none without it); CUDA_LAUNCH_BLOCKING only with a GPU."""
    if not debug:
        return {}
    extra = debug_env(env, gpu=bool(prepared.survey.gpus), ddp_over_gloo=ddp_over_gloo)
    kept = sorted(set(debug_env({}, gpu=True)) & env.keys())
    logs.log.info("debugging", set=extra, kept_from_environment=kept)
    return extra


def freeze_start_up(*, own_process: bool) -> None:
    """In the program's own process, leave what start-up made out of every later full garbage
    collection; call it once the command's heavy imports are done."""
    if not own_process:
        # Frozen objects that became garbage would never be collected: not in a caller's process.
        return
    # torch and trainbox's modules leave about 260,000 objects that live until the process ends.
    # Frozen, no full collection walks them again: in a 40-step run the collections in training
    # and at the group's teardown took 0.29 CPU-s less a rank, measured, and a forked
    # DataLoader worker leaves their pages shared.
    gc.freeze()


def launch(
    prepared: bootstrap.StartupFacts,
    env: Mapping[str, str],
    *,
    argv: Sequence[str],
    extra: Mapping[str, str],
    max_restarts: int,
    deadline_at: float | None,
    work: Callable[[], int],
    dist: config.DistConfig | None = None,
) -> int:
    """Node mode: torchrun's workers run this same command line, unchanged; else pin and work.

    With dist.recovery=in_process each such worker keeps its rank's trainer and a spare.
    """
    context = prepared.context
    dist = dist or config.DistConfig()
    if keeper.kept(env, recovery=dist.recovery):
        return keep(argv, env, dist)
    if dist.recovery == "in_process" and keeper.ROLE not in env and context.rank == 0:
        # One process per rank (srun, mpirun, a script) has no keeper to hold a spare: such a
        # run recovers as before, by a restart from its newest checkpoint.
        logs.log.warning(
            "dist.recovery=in_process needs node mode (one trainbox per node starting the"
            " workers); this run recovers by restarting from its newest checkpoint",
            launcher=context.launcher,
        )
    extra = {**extra, **compile_cache(env, context.local_rank)}
    if context.spawns_workers:
        # The workers inherit --debug's variables from torchrun's environment.
        target = exec_plan.plan(
            context,
            [sys.executable, "-m", "trainbox", *argv],
            {**env, **extra},
            python=sys.executable,
            max_restarts=max_restarts,
        )
        return supervise_workers(target, deadline_at=deadline_at)
    # The one place that writes os.environ: pinning before torch starts its thread pools, and
    # the torchrun-style variables that env:// and the user's libraries read.
    pin(prepared, os.environ)
    os.environ.update(extra)  # before torch loads: some of them are read once, at import
    os.environ.update(context.to_env())
    return work()


def keep(argv: Sequence[str], env: Mapping[str, str], dist: config.DistConfig) -> int:
    """Be this rank's keeper: its trainer and spare run this command line (keeper.py)."""
    # A trainer stopped for half the collective timeout is lost: its peers give up at the
    # whole timeout, so the spare is on its way by then.
    polls = max(1, round(dist.timeout_s / 2 / keeper.POLL_S))
    logs.log.info(
        "keeping this rank: a trainer and a warm spare", max_recoveries=dist.max_recoveries
    )
    command = [sys.executable, "-m", "trainbox", *argv]
    return keeper.Keeper(
        command, env, max_recoveries=dist.max_recoveries, stopped_polls=polls
    ).run()


def compile_cache(env: Mapping[str, str], local_rank: int) -> dict[str, str]:
    """The variables that put torch's compile cache under HOME; logged once per node."""
    cache = caches.compile_cache(env)
    # In node mode the supervisor chose and logged it; its workers only inherit the choice.
    if local_rank == 0 and env.get(preempt.SUPERVISED) != "1":
        logs.log.info("compile cache", path=cache.path, source=cache.source)
    return cache.env


def pin(prepared: bootstrap.StartupFacts, env: MutableMapping[str, str]) -> None:
    """bootstrap.apply_cpu_plan, and log it: the one line saying which CPUs and threads a rank
    got."""
    applied = bootstrap.apply_cpu_plan(prepared, env)
    if prepared.plan is None or applied is None:
        return
    logs.log.info(
        "pinned",
        **affinity.describe(prepared.plan),
        pinned_threads=len(applied.pinned_threads),
        env_set=list(applied.env_set),
        env_kept=list(applied.env_kept),
    )


def supervise_workers(target: exec_plan.ExecPlan, *, deadline_at: float | None) -> int:
    """Run torchrun's agent as a child; the node's exit code from its workers' codes."""
    logs.log.info("starting workers", argv=list(target.argv))
    return supervise.run(target, deadline_at=deadline_at)


def replace_process(target: exec_plan.ExecPlan) -> int:
    """Exec the hand-off's argv in place of this process."""
    logs.log.info("exec", argv=list(target.argv))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(target.argv[0], list(target.argv), target.env)
    except OSError as err:
        raise UsageError(
            f"cannot run {target.argv[0]!r}: {err.strerror}",
            hint="check the command name and that it is on PATH inside the container",
        ) from err
    return 0  # not reached: exec replaced this process
