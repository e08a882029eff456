"""Everything before a command's real work: survey GPUs, detect the launcher, judge, plan CPUs.

This is the side-effecting outer layer around the pure parts (launch.detect, preflight.judge,
affinity.plan). Nothing here imports torch, so pinning can happen before torch starts threads.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from trainbox import affinity, launch, preflight
from trainbox.config import Config
from trainbox.launch.context import LaunchContext
from trainbox.preflight import Expectations, NodeFacts, Report, fabric, judge, node, nvml
from trainbox.preflight.facts import GpuFacts, GpuSurvey


@dataclass(frozen=True, kw_only=True, slots=True)
class StartupFacts:
    """A process ready to do its work."""

    # Where this process sits in the job.
    context: LaunchContext
    # NVML's view of the GPUs this process may use.
    survey: GpuSurvey
    # Preflight findings for this node.
    preflight: Report
    # This rank's CPUs, threads and workers; None for a node agent (its workers pin themselves).
    plan: affinity.CpuPlan | None
    # The node's RDMA ports, NIC speeds, verbs library and NCCL knobs; None when not read.
    fabric: fabric.FabricFacts | None = None


def startup_facts(
    env: Mapping[str, str], config: Config, *, whole_node: bool = False
) -> StartupFacts:
    """Survey, detect, judge and plan; raises LaunchError for a bad environment.

    `whole_node` judges every GPU (doctor); otherwise checks that a sibling rank's own use would
    trip (other processes, compute mode) look only at this rank's GPU.
    """
    gpus_off = config.preflight.gpus == "off"
    survey = preflight.cpu_only("preflight.gpus=off") if gpus_off else nvml.survey(env)
    context = launch.promote(
        launch.from_process(env, visible_gpus=len(survey.gpus)),
        procs_per_node=config.dist.procs_per_node,
        visible_gpus=len(survey.gpus),
    )
    facts = node.read(
        run_dir=config.output_dir,
        master_addr=context.master_addr,
        env=env,
        store=config.store,
        # One probe per node: what it tells (credentials, endpoint, bucket) is the node's.
        probe_store=context.local_rank == 0 or whole_node,
        store_timeout_s=config.storage.timeout_s,
    )
    plan = None if context.spawns_workers else _plan(env, config, context, survey, facts)
    want = Expectations(
        gpus=config.preflight.gpus,
        # A CPU job needs no GPU; a GPU job needs one per local worker.
        gpus_needed=context.local_world_size if survey.gpus else 0,
        own_gpu=None
        if whole_node or context.spawns_workers or not survey.gpus
        else context.local_rank % len(survey.gpus),
        world_size=context.world_size,
        num_workers=plan.num_workers if plan else 0,
        local_world_size=context.local_world_size,
        shm_mib_per_worker=config.preflight.shm_mib_per_worker,
        min_free_disk_mib=config.preflight.min_free_disk_mib,
        other_process_share=config.preflight.other_process_share,
        nccl=bool(survey.gpus) and config.dist.backend != "gloo",
        num_nodes=context.num_nodes,
    )
    findings = Report(
        checks=judge(survey, facts, want), fatal_names=frozenset(config.preflight.fatal)
    )
    return StartupFacts(
        context=context, survey=survey, preflight=findings, plan=plan, fabric=facts.fabric
    )


def apply_cpu_plan(
    prepared: StartupFacts, env: MutableMapping[str, str]
) -> affinity.Applied | None:
    """Apply the CPU plan to this process and to the environment its children inherit."""
    # NVML numbers GPUs in PCI order; CUDA must agree, or index N names two different GPUs.
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return affinity.apply(prepared.plan, env) if prepared.plan is not None else None


def describe(prepared: StartupFacts) -> dict[str, Any]:
    """The doctor report's checks, GPUs and pinning."""
    survey = prepared.survey
    cuda = ".".join(map(str, survey.cuda_driver)) if survey.cuda_driver else None
    return {
        "driver": {"version": survey.driver_version, "cuda": cuda},
        "gpus": [_gpu(gpu) for gpu in survey.gpus],
        "checks": prepared.preflight.describe(),
        "pinning": affinity.describe(prepared.plan) if prepared.plan else {"mode": "agent"},
        "fabric": fabric.describe(prepared.fabric) if prepared.fabric else None,
    }


def _gpu(gpu: GpuFacts) -> dict[str, Any]:
    """Every fact read about one GPU, so a report can be held against `nvidia-smi -q`."""
    found = {field.name: getattr(gpu, field.name) for field in fields(gpu)}
    if gpu.cpu_affinity is not None:
        found["cpu_affinity"] = affinity.format_cpulist(gpu.cpu_affinity)
    if gpu.processes is not None:
        found["processes"] = [asdict(process) for process in gpu.processes]
    return found


def _plan(
    env: Mapping[str, str],
    config: Config,
    context: LaunchContext,
    survey: GpuSurvey,
    facts: NodeFacts,
) -> affinity.CpuPlan:
    pinning = config.pinning
    # Automatic workers never outgrow /dev/shm (Docker's 64 MB default would crash them).
    per_node = config.preflight.shm_mib_per_worker * context.local_world_size
    room = facts.shm_mib // per_node if facts.shm_mib is not None and per_node else None
    # Local rank i drives visible GPU i (wrapping when fewer GPUs than ranks are visible).
    near = [g.cpu_affinity or frozenset() for g in survey.gpus]
    gpu_cpus = [near[i % len(near)] for i in range(context.local_world_size)] if near else []
    return affinity.plan(
        affinity.read(env),
        local_rank=context.local_rank,
        local_world_size=context.local_world_size,
        gpu_cpus=gpu_cpus,
        mode=pinning.mode,
        num_threads=None if pinning.num_threads == "auto" else pinning.num_threads,
        num_workers=None if pinning.num_workers == "auto" else pinning.num_workers,
        max_workers=room,
    )
