"""Judge a node from its facts: pure functions from GpuSurvey and NodeFacts to ok/warn/fail/skip.

Constants are NVML's numeric values, written out so judging never imports pynvml. Each check's
name, scope and default fatality are declared in config/preflight_checks.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainbox.preflight import fabric
from trainbox.preflight.fabric import FabricFacts
from trainbox.preflight.facts import GpuFacts, GpuSurvey

RECOVERY_ACTIONS = {
    1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset",
    5: "recover IMEX domain", 6: "bus reset", 7: "system reboot",
}  # fmt: skip
COMPUTE_PROHIBITED, COMPUTE_EXCLUSIVE_PROCESS = 2, 3
# Clock event reasons that mean the hardware is slowing the GPU (idle and app clocks do not).
SLOWDOWNS = {0x8: "HW slowdown", 0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake"}
REMAP_UNCORRECTABLE_LIMIT = 512  # DCGM's DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE
TEMPERATURE_MARGIN_C = 5
SHM_HINT = (
    "docker run --shm-size=8g (or --ipc=host); Kubernetes: an emptyDir with medium Memory on"
    " /dev/shm; or fewer pinning.num_workers"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    """One finding."""

    # Stable name, as config/preflight_checks.py declares it and preflight.fatal lists it.
    name: str
    # ok, warn, fail or skip.
    status: str
    # What was found, naming GPUs by index and UUID.
    message: str
    # What to do about a warn or fail.
    hint: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeFacts:
    """What preflight knows beyond the GPUs."""

    # CUDA version torch was built with, e.g. (12, 8); None for a CPU build.
    torch_cuda: tuple[int, int] | None
    # Size of /dev/shm in MiB; None if there is none.
    shm_mib: int | None
    # Why run_dir cannot be written, or None.
    run_dir_problem: str | None
    # Free space on run_dir's filesystem, MiB.
    disk_free_mib: int | None
    # Why the master address does not resolve, or None.
    master_problem: str | None
    # RDMA ports, NIC speeds, the verbs library and NCCL's knobs; None when not read.
    fabric: FabricFacts | None = None
    # run_dir as configured, for the finding that names it.
    run_dir: str = ""
    # Whether the machine shows an NVIDIA device (PCI, /dev, the kernel module); None: not read.
    # Without one a missing driver is no news: a CPU machine has nothing for it to drive.
    nvidia_devices: bool | None = None
    # run_dir's s3:// URL, or "" when run_dir is a path.
    store_url: str = ""
    # Why a probe object could not be written and deleted there (and what to do), or None:
    # probed, or not probed by this process (`store_probed`).
    store_problem: tuple[str, str] | None = None
    # Whether this process probed the store (one process per node does).
    store_probed: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Expectations:
    """What this job needs from the node."""

    # preflight.gpus: auto, require or off.
    gpus: str
    # GPUs needed on this node (one per local worker).
    gpus_needed: int
    # Index into the survey of this rank's GPU; None checks every GPU (doctor, node agents).
    own_gpu: int | None
    # Processes in the whole job (MIG cannot carry NCCL traffic between ranks).
    world_size: int
    # DataLoader workers per rank and ranks on this node, for the /dev/shm budget.
    num_workers: int
    local_world_size: int
    # Thresholds from config.
    shm_mib_per_worker: int
    min_free_disk_mib: int
    other_process_share: float
    # Whether the job's collectives would run on NCCL (GPUs and dist.backend auto or nccl).
    nccl: bool = False
    # Nodes in the job: RDMA matters only between them.
    num_nodes: int = 1


def judge(survey: GpuSurvey, node: NodeFacts, want: Expectations) -> tuple[Check, ...]:
    """Every check, in a fixed order."""
    checks = [_driver(survey, node, want)]
    if want.gpus != "off" and survey.driver_error is None:
        checks += [
            _cuda_version(survey, node, want),
            _gpu_count(survey, want),
            _visibility(survey),
            *_per_gpu(survey, want),
        ]
    checks += [_shm(node, want), _run_dir(node), _disk(node, want), _master(node, want)]
    checks.append(_storage(node))
    if node.fabric is not None:
        found = fabric.check_rdma_for_nccl(node.fabric, nccl=want.nccl, num_nodes=want.num_nodes)
        checks.append(
            Check(name="fabric", status=found.status, message=found.message, hint=found.hint)
        )
    return tuple(checks)


def _driver(survey: GpuSurvey, node: NodeFacts, want: Expectations) -> Check:
    if want.gpus == "off":
        return Check(
            name="driver", status="skip", message="GPU checks are off (preflight.gpus=off)"
        )
    if survey.driver_error is None:
        cuda = ".".join(map(str, survey.cuda_driver)) if survey.cuda_driver else "?"
        return Check(
            name="driver", status="ok", message=f"driver {survey.driver_version}, CUDA {cuda}"
        )
    if want.gpus == "require":
        return Check(
            name="driver", status="fail", message=f"no usable NVIDIA driver: {survey.driver_error}",
            hint="run on a GPU node with the driver loaded (docker --gpus all, apptainer --nv)",
        )  # fmt: skip
    if node.nvidia_devices is False:
        return Check(
            name="driver", status="skip",
            message=f"no NVIDIA driver, CPU mode: no NVIDIA device here ({survey.driver_error})",
        )  # fmt: skip
    return Check(
        name="driver", status="warn", message=f"no NVIDIA driver, CPU mode: {survey.driver_error}",
        hint="set preflight.gpus=require to make a missing GPU fatal",
    )  # fmt: skip


def _cuda_version(survey: GpuSurvey, node: NodeFacts, want: Expectations) -> Check:
    name = "cuda_version"
    if node.torch_cuda is None:
        status = "fail" if want.gpus == "require" else "warn"
        return Check(
            name=name, status=status, message="torch is a CPU build, so the GPUs would sit idle",
            hint="install a CUDA build of torch in the image",
        )  # fmt: skip
    if survey.cuda_driver is None:
        return Check(
            name=name, status="skip", message="the driver does not report its CUDA version"
        )
    torch_v, driver_v = node.torch_cuda, survey.cuda_driver
    text = f"torch built for CUDA {torch_v[0]}.{torch_v[1]}, driver has {driver_v[0]}.{driver_v[1]}"
    if driver_v[0] < torch_v[0]:
        return Check(
            name=name,
            status="fail",
            message=text,
            hint="update the driver or use a torch built for an older CUDA",
        )
    if driver_v < torch_v:
        return Check(
            name=name, status="warn", message=f"{text} (minor-version compatibility only)",
            hint="kernels that need newer PTX may fail; update the driver",
        )  # fmt: skip
    return Check(name=name, status="ok", message=text)


def _gpu_count(survey: GpuSurvey, want: Expectations) -> Check:
    found = len(survey.gpus)
    if found == 0 and want.gpus == "auto":
        return Check(
            name="gpu_count", status="warn", message="no GPU visible to this process: CPU mode"
        )
    if found < want.gpus_needed:
        return Check(
            name="gpu_count", status="fail",
            message=f"{found} GPU(s) visible but {want.gpus_needed} local worker(s) each need one",
            hint="request --gpus-per-node equal to the tasks per node, or fewer workers per node",
        )  # fmt: skip
    return Check(
        name="gpu_count",
        status="ok",
        message=f"{found} GPU(s) for {want.gpus_needed} local worker(s)",
    )


def _visibility(survey: GpuSurvey) -> Check:
    if survey.unmatched:
        return Check(
            name="gpu_visibility", status="fail", message="; ".join(survey.unmatched),
            hint="CUDA_VISIBLE_DEVICES must name this node's GPUs (PCI-order indices or UUIDs)",
        )  # fmt: skip
    return Check(
        name="gpu_visibility", status="ok", message="every CUDA_VISIBLE_DEVICES entry matches a GPU"
    )


def _label(gpu: GpuFacts) -> str:
    mig = f" MIG {gpu.mig_uuid}" if gpu.mig_uuid else ""
    return f"GPU {gpu.index} ({gpu.uuid or 'UUID unreadable'}{mig})"


# A rule's verdict on one GPU: (status, finding) when bad, None when fine, "skip" when unreadable.
Finding = tuple[str, str] | str | None
Rule = Callable[[GpuFacts, Expectations], Finding]


def _lost(gpu: GpuFacts, _want: Expectations) -> Finding:
    return ("fail", gpu.lost) if gpu.lost else None


def _memory(gpu: GpuFacts, want: Expectations) -> Finding:
    if gpu.memory_total_mib is None or gpu.memory_used_mib is None:
        return "skip"
    if gpu.memory_used_mib > want.other_process_share * gpu.memory_total_mib:
        return "warn", f"{gpu.memory_used_mib} of {gpu.memory_total_mib} MiB already in use"
    return None


def _ecc(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.ecc_uncorrected_volatile is None:
        return "skip"
    count = gpu.ecc_uncorrected_volatile
    return ("fail", f"{count} volatile uncorrected ECC error(s)") if count else None


def _recovery(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.recovery_action is None:
        return "skip"
    action = gpu.recovery_action
    if action == 0:
        return None
    return "fail", f"driver asks for recovery: {RECOVERY_ACTIONS.get(action, f'action {action}')}"


def _remap(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.remap_failed is None and gpu.remap_pending is None:
        return "skip"
    if gpu.remap_failed:
        return "fail", "row remapping failed"
    if gpu.remap_pending:
        return "fail", "row remapping pending (needs a GPU reset)"
    if (gpu.remapped_uncorrectable or 0) >= REMAP_UNCORRECTABLE_LIMIT:
        return "fail", f"{gpu.remapped_uncorrectable} rows remapped for uncorrectable errors"
    return None


def _retired(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.retired_pages_pending is None:
        return "skip"
    return (
        ("fail", "retired pages pending (needs a GPU reset)") if gpu.retired_pages_pending else None
    )


def _clocks(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.clock_event_reasons is None:
        return "skip"
    active = [text for bit, text in SLOWDOWNS.items() if gpu.clock_event_reasons & bit]
    return ("warn", "clocks held down: " + ", ".join(active)) if active else None


def _temperature(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.temperature_c is None or gpu.temperature_slowdown_c is None:
        return "skip"
    if gpu.temperature_c >= gpu.temperature_slowdown_c - TEMPERATURE_MARGIN_C:
        return "warn", f"{gpu.temperature_c} °C, slowdown at {gpu.temperature_slowdown_c} °C"
    return None


def _pcie(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.pcie_width is None or gpu.pcie_width_max is None:
        return "skip"
    problems = []
    if gpu.pcie_width < gpu.pcie_width_max:
        problems.append(f"link x{gpu.pcie_width} of x{gpu.pcie_width_max}")
    if (
        gpu.pcie_gen is not None
        and gpu.pcie_gen_max is not None
        and gpu.pcie_gen < gpu.pcie_gen_max
    ):
        problems.append(f"gen {gpu.pcie_gen} of {gpu.pcie_gen_max} (normal while idle)")
    return ("warn", ", ".join(problems)) if problems else None


def _mig(gpu: GpuFacts, want: Expectations) -> Finding:
    if gpu.mig_enabled is None:
        return "skip"
    if gpu.mig_enabled and gpu.mig_uuid is None:
        return "fail", "MIG mode is on, so the whole GPU cannot be used"
    if gpu.mig_uuid is not None and want.world_size > 1:
        return "fail", "a MIG instance cannot carry NCCL traffic between ranks"
    return None


def _compute_mode(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.compute_mode is None:
        return "skip"
    if gpu.compute_mode == COMPUTE_PROHIBITED:
        return "fail", "compute mode is PROHIBITED"
    if gpu.compute_mode == COMPUTE_EXCLUSIVE_PROCESS and gpu.processes:
        return "fail", "compute mode is EXCLUSIVE_PROCESS and another process holds the GPU"
    return None


def _processes(gpu: GpuFacts, want: Expectations) -> Finding:
    if gpu.processes is None:
        return "skip"
    if not gpu.processes:
        return None
    held = sum(p.used_mib or 0 for p in gpu.processes)
    pids = ", ".join(str(p.pid) for p in gpu.processes)
    text = f"{len(gpu.processes)} other process(es) (host PIDs {pids}) hold {held} MiB"
    total = gpu.memory_total_mib or 0
    return ("fail", text) if total and held > want.other_process_share * total else ("warn", text)


def _persistence(gpu: GpuFacts, _want: Expectations) -> Finding:
    if gpu.persistence is None:
        return "skip"
    return None if gpu.persistence else ("warn", "persistence mode is off (slower CUDA start)")


# name, rule, hint, whether only this rank's GPU counts (another local rank may use the others).
PER_GPU: tuple[tuple[str, Rule, str, bool], ...] = (
    ("gpu_lost", _lost, "drain the node and reset the GPU (nvidia-smi -r) or reboot", False),
    ("memory", _memory, "another job may share this GPU; check nvidia-smi", True),
    ("ecc", _ecc, "drain the node; the GPU needs a reset and an operator's look", False),
    ("recovery_action", _recovery, "drain the node and do what the driver asks", False),
    ("row_remap", _remap, "drain the node and reset the GPU", False),
    ("retired_pages", _retired, "drain the node and reset the GPU", False),
    ("clocks", _clocks, "check cooling and power; this GPU will straggle", False),
    ("temperature", _temperature, "check cooling; this GPU will straggle", False),
    ("pcie_link", _pcie, "reseat the card or check the riser; host transfers will be slow", False),
    ("mig", _mig, "disable MIG (nvidia-smi -mig 0) or run one process on one instance", False),
    ("compute_mode", _compute_mode, "set compute mode DEFAULT (nvidia-smi -c 0)", True),
    (
        "gpu_processes",
        _processes,
        "another job holds this GPU; check nvidia-smi and the scheduler",
        True,
    ),
    ("persistence", _persistence, "enable persistence mode (nvidia-smi -pm 1)", False),
)


def _per_gpu(survey: GpuSurvey, want: Expectations) -> Iterable[Check]:
    for name, rule, hint, own_only in PER_GPU:
        gpus = survey.gpus
        if own_only and want.own_gpu is not None and want.own_gpu < len(gpus):
            gpus = (gpus[want.own_gpu],)
        findings = [(gpu, rule(gpu, want)) for gpu in gpus]
        bad = [(gpu, f) for gpu, f in findings if isinstance(f, tuple)]
        if bad:
            status = "fail" if any(f[0] == "fail" for _, f in bad) else "warn"
            message = "; ".join(f"{_label(gpu)}: {f[1]}" for gpu, f in bad)
            yield Check(name=name, status=status, message=message, hint=hint)
        elif gpus and all(f == "skip" for _, f in findings):
            yield Check(name=name, status="skip", message="not supported by this GPU or driver")
        elif gpus:
            yield Check(name=name, status="ok", message=f"{len(gpus)} GPU(s) fine")


def _shm(node: NodeFacts, want: Expectations) -> Check:
    if want.num_workers == 0:
        return Check(name="shm", status="ok", message="no DataLoader workers, /dev/shm not needed")
    needed = want.shm_mib_per_worker * want.num_workers * want.local_world_size
    have = node.shm_mib or 0
    ranks, workers = want.local_world_size, want.num_workers
    text = f"/dev/shm has {have} MiB; {ranks} rank(s) x {workers} worker(s) want {needed} MiB"
    if have < needed:
        return Check(name="shm", status="fail", message=text, hint=SHM_HINT)
    return Check(name="shm", status="ok", message=text)


def _run_dir(node: NodeFacts) -> Check:
    if node.run_dir_problem:
        return Check(
            name="run_dir",
            status="fail",
            message=node.run_dir_problem,
            hint="point run_dir at a writable, mounted directory",
        )
    named = f"run_dir={node.run_dir!r}" if node.run_dir else "run_dir"
    return Check(name="run_dir", status="ok", message=f"{named} is writable")


def _storage(node: NodeFacts) -> Check:
    if not node.store_url:
        return Check(name="storage", status="skip", message="run_dir is a file system path")
    if not node.store_probed:
        message = f"{node.store_url}: probed by local rank 0 of this node"
        return Check(name="storage", status="skip", message=message)
    if node.store_problem is not None:
        message, hint = node.store_problem
        return Check(name="storage", status="fail", message=message, hint=hint)
    message = f"{node.store_url} takes a probe object (written and deleted)"
    return Check(name="storage", status="ok", message=message)


def _disk(node: NodeFacts, want: Expectations) -> Check:
    if node.disk_free_mib is None:
        return Check(name="disk_space", status="skip", message="free space unknown")
    text = f"{node.disk_free_mib} MiB free for run_dir (at least {want.min_free_disk_mib} wanted)"
    if node.disk_free_mib < want.min_free_disk_mib:
        return Check(
            name="disk_space", status="fail", message=text, hint="free space or move run_dir"
        )
    return Check(name="disk_space", status="ok", message=text)


def _master(node: NodeFacts, want: Expectations) -> Check:
    if want.world_size == 1:
        return Check(name="master_address", status="skip", message="one process, no rendezvous")
    if node.master_problem:
        return Check(
            name="master_address", status="fail", message=node.master_problem,
            hint="MASTER_ADDR must name rank 0's host as every node resolves it (DNS, /etc/hosts)",
        )  # fmt: skip
    return Check(name="master_address", status="ok", message="the master address resolves")
