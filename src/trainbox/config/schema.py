"""The run configuration's schema: one frozen dataclass per section, each field with its default,
type, one-line doc and bounds. trainbox/config/loading.py reads YAML and overrides into it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainbox.config.preflight_checks import FATAL_CHECKS
from trainbox.storage import location


def doc(text: str, *, minimum: float | None = None, maximum: float | None = None) -> dict[str, Any]:
    """Field metadata: the one-line help shown in docs/configuration.md, and numeric bounds."""
    return {"doc": text, "minimum": minimum, "maximum": maximum}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """What to train."""

    factory: str = field(
        default="trainbox.tasks.spirals:model",
        metadata=doc("`module:function` that returns a `torch.nn.Module`"),
    )
    args: dict[str, Any] = field(
        default_factory=dict, metadata=doc("keyword arguments passed to the model factory")
    )


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What to train on."""

    factory: str = field(
        default="trainbox.tasks.spirals:data",
        metadata=doc(
            "`module:function` that returns `Datasets(train=..., val=...)` or `(train, val)`"
        ),
    )
    args: dict[str, Any] = field(
        default_factory=dict, metadata=doc("keyword arguments passed to the data factory")
    )


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How long and how to train."""

    max_steps: int = field(default=3000, metadata=doc("optimizer steps to train for", minimum=1))
    batch_size: int = field(
        default=64, metadata=doc("samples per process per micro-batch", minimum=1)
    )
    grad_accum: int = field(
        default=1, metadata=doc("micro-batches accumulated per optimizer step", minimum=1)
    )
    log_every: int = field(default=50, metadata=doc("steps between metrics lines", minimum=1))
    eval_every: int = field(
        default=500,
        metadata=doc("steps between evaluations; 0 evaluates only at the end", minimum=0),
    )
    ckpt_every: int = field(
        default=1000, metadata=doc("steps between checkpoints; 0 saves only at the end", minimum=0)
    )
    keep_last: int = field(default=3, metadata=doc("checkpoints kept on disk", minimum=1))
    async_save: bool = field(
        default=False,
        metadata=doc(
            "write checkpoints on a background thread while training goes on (the last one and"
            " a preemption checkpoint are written before exit)"
        ),
    )
    deadline_margin_s: float = field(
        default=300.0,
        metadata=doc(
            "stop (checkpoint, exit 143) this many seconds before Slurm's SLURM_JOB_END_TIME",
            minimum=0,
        ),
    )
    resume: str = field(
        default="auto",
        metadata=doc("`auto` (newest valid checkpoint in run_dir), `never`, or a checkpoint path"),
    )
    resume_changes: Literal["refuse", "allow"] = field(
        default="refuse",
        metadata=doc(
            "resuming with a changed optimizer, model, data, precision or seed: `refuse` (exit 2"
            " with the differences) or `allow` (docs/training.md)"
        ),
    )
    deterministic: bool = field(
        default=False, metadata=doc("use only deterministic kernels (slower on GPU)")
    )
    amp: Literal["auto", "off", "bf16", "fp16"] = field(
        default="auto",
        metadata=doc("mixed precision; `auto` is bf16 on a GPU that has it, else off"),
    )
    clip_grad_norm: float = field(
        default=0.0, metadata=doc("clip the gradient norm to this value; 0 disables", minimum=0)
    )
    compile: bool = field(
        default=False,
        metadata=doc("wrap the model in `torch.compile` (fsdp: each sharded unit's forward)"),
    )
    strategy: Literal["ddp", "fsdp", "hsdp"] = field(
        default="ddp",
        metadata=doc(
            "`ddp` (every rank holds the whole model), `fsdp` (FSDP2: parameters, gradients and"
            " optimizer state sharded over the ranks) or `hsdp` (FSDP2 sharded within groups of"
            " `train.shard_size` ranks, replicated across them; docs/fsdp.md)"
        ),
    )
    shard_size: int = field(
        default=0,
        metadata=doc(
            "hsdp: ranks in one shard group, consecutive ranks, replicated across groups; 0: the"
            " ranks of one node (the launcher's local world size)",
            minimum=0,
        ),
    )
    fsdp_units: str = field(
        default="",
        metadata=doc("`module:function` `(model) -> [submodule, ...]`: fsdp's sharded units "
                     "(the root is always one); empty: the model's repeated blocks"),
    )  # fmt: skip
    fsdp_reshard_after_forward: bool = field(
        default=True,
        metadata=doc(
            "fsdp: free each unit's gathered parameters after its forward and gather them again"
            " for backward (`false`: keep them, less traffic, more memory; the root always keeps)"
        ),
    )
    activation_checkpointing: bool = field(
        default=False,
        metadata=doc(
            "recompute each block's activations in backward instead of keeping them (fsdp's units;"
            " under ddp the model's repeated blocks); the same numbers, less memory, more compute"
        ),
    )
    find_unused_parameters: bool = field(
        default=False, metadata=doc("DDP's switch for models whose forward skips parameters")
    )
    loss: Literal["cross_entropy", "mse"] = field(
        default="cross_entropy",
        metadata=doc("`cross_entropy` (metrics: loss, accuracy) or `mse` (metrics: loss, mae)"),
    )
    step: str = field(
        default="",
        metadata=doc("`module:function` `(model, batch) -> loss` or `(loss, {name: scalar})`; "
                     "empty: the built-in step for `train.loss`"),
    )  # fmt: skip
    state_factory: str = field(
        default="",
        metadata=doc("`module:function` `(model, optimizer) -> {name: obj}`: state saved in "
                     "every checkpoint (an EMA, a counter); empty: none"),
    )  # fmt: skip
    init_from: str = field(
        default="",
        metadata=doc(
            "a run_dir or checkpoint file (under fsdp also a sharded step-*.dcp"
            " folder) whose weights a new run starts from"
        ),
    )
    init_prefix: str = field(
        default="", metadata=doc("take only init_from's tensors under this prefix, stripped")
    )
    init_strict: bool = field(
        default=True, metadata=doc("init_from must cover every tensor of the model, and no more")
    )
    eval_step: str = field(
        default="",
        metadata=doc(
            "`module:function`, `(model, batch) -> {name: (sum, count)}`: the validation metrics;"
            " empty: the built-in ones of `train.loss`"
        ),
    )
    predict_step: str = field(
        default="",
        metadata=doc(
            "`module:function`, `(model, batch) -> {column: per-sample values}`: what `predict`"
            " writes; empty: the built-in columns of `train.loss`"
        ),
    )

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded (fsdp, hsdp): DCP checkpoints, collective loads."""
        return self.strategy != "ddp"


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    name: Literal["adamw", "sgd"] = field(default="adamw", metadata=doc("optimizer"))
    lr: float = field(default=3e-3, metadata=doc("peak learning rate (before scaling)", minimum=0))
    weight_decay: float = field(default=0.0, metadata=doc("weight decay", minimum=0))
    momentum: float = field(default=0.9, metadata=doc("SGD momentum", minimum=0, maximum=1))
    scale_lr: Literal["none", "linear", "sqrt"] = field(
        default="none",
        metadata=doc("scale lr by world size * grad_accum: linearly, by sqrt, or not"),
    )
    warmup_steps: int = field(default=50, metadata=doc("linear warmup steps", minimum=0))
    schedule: Literal["cosine", "constant"] = field(
        default="cosine",
        metadata=doc("after warmup: cosine decay to min_lr_ratio * lr, or constant"),
    )
    min_lr_ratio: float = field(
        default=0.0,
        metadata=doc("final lr of the cosine schedule, as a share of lr", minimum=0, maximum=1),
    )
    factory: str = field(
        default="",
        metadata=doc("`module:function` `(model, **args) -> Optimizer`; empty: `optim.name`"),
    )
    args: dict[str, Any] = field(
        default_factory=dict, metadata=doc("keyword arguments passed to the optimizer factory")
    )
    schedule_factory: str = field(
        default="",
        metadata=doc("`module:function` `(optimizer, max_steps, **args) -> LRScheduler`; "
                     "empty: warmup + `optim.schedule`"),
    )  # fmt: skip
    schedule_args: dict[str, Any] = field(
        default_factory=dict, metadata=doc("keyword arguments passed to the schedule factory")
    )


@dataclass(frozen=True, kw_only=True)
class DistConfig:
    """The process group."""

    backend: Literal["auto", "gloo", "nccl"] = field(
        default="auto", metadata=doc("`auto` is nccl when this process has a GPU, else gloo")
    )
    timeout_s: float = field(
        default=600.0, metadata=doc("seconds a rendezvous or collective may wait", minimum=1)
    )
    procs_per_node: int | Literal["auto"] = field(
        default="auto",
        metadata=doc("workers per node when the launcher starts one process per node: `auto` is "
                     "one per visible GPU (one process without GPUs)", minimum=1),
    )  # fmt: skip
    max_restarts: int = field(
        default=0, metadata=doc("node mode: times torchrun restarts the node's workers", minimum=0)
    )
    recovery: Literal["restart", "in_process"] = field(
        default="restart",
        metadata=doc("node mode: `in_process` keeps a warm spare beside each worker; when a worker "
                     "dies its spare takes the rank and the survivors hand it the state in memory "
                     "(docs/reliability.md#in-process-recovery); `restart`: torchrun restarts the "
                     "node's workers from the last checkpoint"),
    )  # fmt: skip
    max_recoveries: int = field(
        default=3,
        metadata=doc("dist.recovery=in_process: times a spare replaces each worker before the "
                     "node falls back to `restart`", minimum=0),
    )  # fmt: skip
    vote_every_s: float = field(
        default=0.1,
        metadata=doc("seconds between stop votes: a signal or the deadline stops every rank about "
                     "this long plus a step later; while steps are fast the votes stretch up to "
                     "0.4 s apart as long as a stop still lands within 0.5 s, and a rank asked "
                     "to stop votes at once; each vote is one small all-reduce per rank (its "
                     "cost: benchmarks/README.md, trainer overhead)",
                     minimum=0.01, maximum=60),
    )  # fmt: skip
    flight_recorder_entries: int = field(
        default=2000,
        metadata=doc("nccl only: collectives each rank's NCCL Flight Recorder keeps, dumped into "
                     "run_dir/hang/ when a collective times out (TORCH_NCCL_TRACE_BUFFER_SIZE, "
                     "TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_NCCL_DEBUG_INFO_TEMP_FILE, unless set); "
                     "0 turns it off", minimum=0, maximum=1_000_000),
    )  # fmt: skip
    exit_grace_s: float = field(
        default=0.1,
        metadata=doc("exec: seconds a command's Python waits at exit once it imported "
                     "torch.distributed, so gloo's worker thread finishes before the interpreter "
                     "does (without it a finished run can abort with SIGABRT); 0 turns it off",
                     minimum=0, maximum=60),
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class PreflightConfig:
    """Node checks before training."""

    gpus: Literal["auto", "require", "off"] = field(
        default="auto",
        metadata=doc("`auto`: check GPUs if a driver is present, else CPU mode (a warning where an "
                     "NVIDIA device is present); "
                     "`require`: no usable GPU is fatal; `off`: no GPU checks"),
    )  # fmt: skip
    fatal: list[str] = field(
        default_factory=lambda: list(FATAL_CHECKS),
        metadata=doc("checks whose failure stops the run (exit 3); others only warn"),
    )
    min_free_disk_mib: int = field(
        default=1024, metadata=doc("free space run_dir's filesystem must have", minimum=0)
    )
    shm_mib_per_worker: int = field(
        default=256, metadata=doc("/dev/shm wanted per DataLoader worker per rank", minimum=0)
    )
    other_process_share: float = field(
        default=0.1,
        metadata=doc(
            "GPU memory share other processes may hold before it fails", minimum=0, maximum=1
        ),
    )


@dataclass(frozen=True, kw_only=True)
class PinningConfig:
    """CPUs, threads and DataLoader workers for each rank."""

    mode: Literal["auto", "exclusive", "node", "off"] = field(
        default="auto",
        metadata=doc("`exclusive`: disjoint CPUs near the rank's GPU; `node`: the GPU's NUMA node; "
                     "`off`: leave affinity alone; `auto`: exclusive when possible"),
    )  # fmt: skip
    num_threads: int | Literal["auto"] = field(
        default="auto", metadata=doc("torch/OMP/MKL threads per rank", minimum=1)
    )
    num_workers: int | Literal["auto"] = field(
        default="auto", metadata=doc("DataLoader worker processes per rank", minimum=0)
    )


@dataclass(frozen=True, kw_only=True)
class LoggingConfig:
    """Where the metrics records go besides metrics.jsonl (docs/tracking.md)."""

    tensorboard: bool = field(
        default=False,
        metadata=doc("also write TensorBoard event files to run_dir/tensorboard (rank 0)"),
    )
    sinks: list[str] = field(
        default_factory=list,
        metadata=doc("`module:function`s called with run_dir, each returning a metrics sink"),
    )


# XIDs that stop a run during training (DCGM's fatal grading; see docs/fleet-health.md).
FATAL_XIDS = [48, 64, 74, 79, 95, 119, 120, 140]


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    """run_dir=s3://: how long the object store may take."""

    timeout_s: float = field(
        default=60.0,
        metadata=doc("seconds one request to an s3:// run_dir's store may go unanswered before "
                     "it is tried again (3 tries in all), after which the save fails with the "
                     "store's error and the checkpoints already stored are kept", minimum=1),
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class HealthConfig:
    """What training watches in the fleet while it runs: stragglers, GPU and process telemetry,
    and the GPU fault stop (docs/fleet-health.md)."""

    telemetry: bool = field(
        default=True,
        metadata=doc("sample each rank's GPU (NVML) and process (CPU, RSS) in a thread of its own "
                     "and write `gpu`/`host` records at log points; false also ends the GPU fault "
                     "watch"),
    )  # fmt: skip
    sample_every_s: float = field(
        default=2.0,
        metadata=doc("seconds between two samples of a rank's GPU and process",
                     minimum=0.05, maximum=3600),
    )  # fmt: skip
    stop_on_gpu_fault: bool = field(
        default=True,
        metadata=doc("a fatal XID or a rise of the volatile uncorrected ECC count on a rank's GPU "
                     "stops every rank after an agreed step with a checkpoint, then exit 3; false "
                     "only logs it"),
    )  # fmt: skip
    fatal_xids: list[int] = field(
        default_factory=lambda: list(FATAL_XIDS),
        metadata=doc("XIDs that count as a GPU fault; application XIDs (13, 31, 43, 45, 68, 109) "
                     "are always ignored"),
    )  # fmt: skip
    stragglers: bool = field(
        default=True,
        metadata=doc("name the rank the others wait for: one whose own time per step (compute, "
                     "data wait, time between steps, pauses) is far above the median (a "
                     "`straggler` record and a warning); false turns it off"),
    )  # fmt: skip
    straggler_factor: float = field(
        default=1.5,
        metadata=doc("a rank is slow when its own time per step exceeds the median's by this "
                     "factor",
                     minimum=1),
    )  # fmt: skip
    straggler_floor_ms: float = field(
        # Above what a busy CPU's scheduler takes from a healthy rank (docs/fleet-health.md).
        default=5.0,
        metadata=doc("...and by at least this many milliseconds per step (so scheduling "
                     "noise never counts)", minimum=0),
    )  # fmt: skip
    straggler_windows: int = field(
        default=2,
        metadata=doc("...for this many log windows in a row (`train.log_every` steps each; "
                     "shorter than 20 steps, log windows add up to 20 first)", minimum=1),
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Config:
    """A whole run."""

    name: str = field(default="example", metadata=doc("run name; run_dir defaults to runs/<name>"))
    run_dir: str = field(
        default="",
        metadata=doc("output directory: a shared (or, for one node, local) file system path, "
                     "or s3://BUCKET/PREFIX on an S3-compatible store; empty means runs/<name>"),
    )  # fmt: skip
    seed: int = field(default=0, metadata=doc("seed for model init, data order and dropout"))
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    pinning: PinningConfig = field(default_factory=PinningConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)

    @property
    def output_dir(self) -> Path:
        """Where this run writes its files: run_dir, or the node's working copy of an s3:// one."""
        store = location.parse(self.run_dir)
        if store is not None:
            return location.working_copy(store, os.environ)
        return Path(self.run_dir or f"runs/{self.name}")

    @property
    def store(self) -> location.Location | None:
        """Where in an object store the run keeps its files (None: run_dir is a path)."""
        return location.parse(self.run_dir)
