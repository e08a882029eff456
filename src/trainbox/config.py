"""The run configuration: frozen dataclasses from YAML and dotted overrides, checked strictly.

Precedence, lowest to highest: the defaults below < `--config FILE` < `key.sub=value` arguments.
Environment variables are facts from the launcher, never configuration.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from trainbox.errors import UsageError

HINT = (
    "see the configuration reference in docs/configuration.md; "
    "override keys as `train.max_steps=200`"
)
FACTORY_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
# Marks a field whose value failed its check; the field then keeps its default.
_INVALID: Any = object()


class ConfigError(UsageError):
    """The configuration file or an override is missing, malformed, mistyped or unknown."""


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
    compile: bool = field(default=False, metadata=doc("wrap the model in `torch.compile`"))
    find_unused_parameters: bool = field(
        default=False, metadata=doc("DDP's switch for models whose forward skips parameters")
    )
    loss: Literal["cross_entropy", "mse"] = field(
        default="cross_entropy",
        metadata=doc("`cross_entropy` (metrics: loss, accuracy) or `mse` (metrics: loss, mae)"),
    )


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


# Checks whose `fail` stops the run by default; the others can only warn.
FATAL_CHECKS = [
    "driver", "cuda_version", "gpu_count", "gpu_visibility", "gpu_lost", "ecc",
    "recovery_action", "row_remap", "retired_pages", "mig", "compute_mode", "gpu_processes",
    "shm", "run_dir", "disk_space", "master_address",
]  # fmt: skip
# Every preflight check by name; these can warn but never fail.
CHECK_NAMES = (*FATAL_CHECKS, "memory", "clocks", "temperature", "pcie_link", "persistence")


@dataclass(frozen=True, kw_only=True)
class PreflightConfig:
    """Node checks before training."""

    gpus: Literal["auto", "require", "off"] = field(
        default="auto",
        metadata=doc("`auto`: check GPUs if a driver is present, else CPU mode with a warning; "
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
class Config:
    """A whole run."""

    name: str = field(default="example", metadata=doc("run name; run_dir defaults to runs/<name>"))
    run_dir: str = field(default="", metadata=doc("output directory; empty means runs/<name>"))
    seed: int = field(default=0, metadata=doc("seed for model init, data order and dropout"))
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    pinning: PinningConfig = field(default_factory=PinningConfig)

    @property
    def output_dir(self) -> Path:
        """Where this run writes its files."""
        return Path(self.run_dir or f"runs/{self.name}")


def load(path: str | None, overrides: Sequence[str]) -> Config:
    """The config from defaults, an optional YAML file and dotted overrides; all errors at once."""
    problems: list[str] = []
    data = _read_file(path, problems) if path else {}
    cli = _parse_overrides(overrides, problems)
    config = _build(Config, data, cli, "", problems)
    for name in config.preflight.fatal:
        if name not in CHECK_NAMES:
            close = difflib.get_close_matches(name, CHECK_NAMES, n=1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"preflight.fatal names an unknown check {name!r}{suggestion}")
    if problems:
        raise ConfigError(problems, hint=HINT)
    return config


def as_dict(config: Config) -> dict[str, Any]:
    """Plain data, in field order (config.yaml and hashing)."""
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    """The fully resolved config as YAML, loadable again with `--config`."""
    return yaml.safe_dump(as_dict(config), sort_keys=False)


def fingerprint(value: Any) -> str:
    """SHA-256 of any config section, independent of key order."""
    data = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def reference_markdown() -> str:
    """The config reference table in docs/configuration.md, generated from the dataclasses."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, kind, spec, default in _leaves(Config, ""):
        rows.append(f"| `{key}` | {_type_name(kind)} | `{default!r}` | {spec.metadata['doc']} |")
    return "\n".join(rows)


def _read_file(path: str, problems: list[str]) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        problems.append(f"config file {path!r} cannot be read ({err.strerror})")
        return {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problems.append(f"config file {path!r} is not valid YAML{at}")
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(
            f"config file {path!r} must hold a mapping of keys, not {type(data).__name__}"
        )
        return {}
    return data


def _parse_overrides(overrides: Sequence[str], problems: list[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"override {item!r} is not key=value")
            continue
        parsed[key.strip()] = value
    return parsed


def _build(cls: type, data: Any, cli: dict[str, str], prefix: str, problems: list[str]) -> Any:
    if not isinstance(data, dict):
        problems.append(f"{prefix.rstrip('.')} must be a mapping, not {data!r}")
        data = {}
    specs = {spec.name: spec for spec in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    given = [f"{prefix}{key}" for key in data] + [key for key in cli if key.startswith(prefix)]
    _reject_unknown(given, specs, prefix, problems)
    values: dict[str, Any] = {}
    for name, spec in specs.items():
        key, kind = f"{prefix}{name}", hints[name]
        leaf = not dataclasses.is_dataclass(kind) and kind != dict[str, Any]
        if leaf and any(other.startswith(f"{key}.") for other in cli):
            problems.append(f"{key} is a single value, not a section with keys")
        if dataclasses.is_dataclass(kind) and key in cli:
            problems.append(f"{key} is a section; set its keys instead, e.g. {key}.<key>=...")
        if dataclasses.is_dataclass(kind):
            values[name] = _build(kind, data.get(name, {}), cli, f"{key}.", problems)
        elif kind == dict[str, Any]:
            values[name] = _mapping(key, data.get(name, {}), cli, problems)
        elif key in cli:
            values[name] = _check(key, _parse_cli(cli[key], kind), kind, spec, problems)
        elif name in data:
            values[name] = _check(key, data[name], kind, spec, problems)
    return cls(**{name: value for name, value in values.items() if value is not _INVALID})


def _reject_unknown(
    keys: list[str], specs: Mapping[str, dataclasses.Field[Any]], prefix: str, problems: list[str]
) -> None:
    # Only the next component is judged here; deeper ones are judged when their section is built.
    known = [f"{prefix}{name}" for name in specs]
    for head in dict.fromkeys(prefix + key[len(prefix) :].split(".")[0] for key in keys):
        if head not in known:
            close = difflib.get_close_matches(head, known, n=1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown key {head!r}{suggestion}")


def _mapping(key: str, value: Any, cli: dict[str, str], problems: list[str]) -> Any:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        problems.append(f"{key} must be a mapping of names to values, not {value!r}")
        return _INVALID
    merged = dict(value)
    for dotted, text in cli.items():
        if dotted.startswith(f"{key}."):
            merged[dotted[len(key) + 1 :]] = _parse_cli(text, Any)
    return merged


def _parse_cli(text: str, kind: Any) -> Any:
    # A str field takes the text as typed (so `name=007` stays "007"), and so does a choice
    # (YAML would read `amp=off` as false); others parse as YAML.
    if kind is str or typing.get_origin(kind) is Literal:
        return text
    try:
        return yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text


def _check(
    key: str, value: Any, kind: Any, spec: dataclasses.Field[Any], problems: list[str]
) -> Any:
    value = _yaml11_forgiven(value, kind)
    problem = _type_problem(value, kind)
    if problem is None:
        problem = _bound_problem(value, spec)
    if problem is None and spec.name == "factory" and not FACTORY_PATTERN.fullmatch(value):
        problem = "must look like package.module:function"
    if problem is not None:
        problems.append(f"{key}={value!r} {problem}")
        return _INVALID
    return float(value) if kind is float else value


def _yaml11_forgiven(value: Any, kind: Any) -> Any:
    # PyYAML follows YAML 1.1: `lr: 1e-3` stays a string and `amp: off` becomes false.
    # Both are what the user meant, so read them that way.
    if kind is float and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return number if math.isfinite(number) else value
    if typing.get_origin(kind) is Literal and isinstance(value, bool):
        word = "on" if value else "off"
        return word if word in typing.get_args(kind) else value
    return value


def _type_problem(value: Any, kind: Any) -> str | None:
    if _is_union(kind):
        options = typing.get_args(kind)
        if any(_type_problem(value, option) is None for option in options):
            return None
        return "must be " + " or ".join(_type_name(option).replace("`", "") for option in options)
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        if isinstance(value, list) and all(_type_problem(v, item) is None for v in value):
            return None
        return f"must be a list of {_type_name(item)}"
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        return None if value in choices else f"must be one of {', '.join(map(str, choices))}"
    if kind is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if kind is int:
        return (
            None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"
        )
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if kind is str:
        return None if isinstance(value, str) else "must be a string"
    raise TypeError(f"unsupported config field type {kind!r}")  # a bug in the schema, not input


def _bound_problem(value: Any, spec: dataclasses.Field[Any]) -> str | None:
    low, high = spec.metadata.get("minimum"), spec.metadata.get("maximum")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if low is not None and value < low:
        return f"must be at least {low}"
    if high is not None and value > high:
        return f"must be at most {high}"
    return None


def _leaves(cls: type, prefix: str) -> list[tuple[str, Any, dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    leaves: list[tuple[str, Any, dataclasses.Field[Any], Any]] = []
    defaults = cls()
    for spec in dataclasses.fields(cls):
        kind = hints[spec.name]
        if dataclasses.is_dataclass(kind):
            leaves.extend(_leaves(kind, f"{prefix}{spec.name}."))
        else:
            leaves.append((f"{prefix}{spec.name}", kind, spec, getattr(defaults, spec.name)))
    return leaves


def _is_union(kind: Any) -> bool:
    # `int | str` is a types.UnionType, but `int | Literal["auto"]` is a typing.Union.
    return isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union


def _type_name(kind: Any) -> str:
    if _is_union(kind):
        return " \\| ".join(_type_name(option) for option in typing.get_args(kind))
    if typing.get_origin(kind) is list:
        return f"list of {_type_name(typing.get_args(kind)[0])}"
    if typing.get_origin(kind) is Literal:
        return " \\| ".join(f"`{choice}`" for choice in typing.get_args(kind))
    if kind == dict[str, Any]:
        return "mapping"
    return kind.__name__ if isinstance(kind, type) else str(kind)
