"""The one checkpoint payload: what a training checkpoint holds, built and read only here.

The trainer writes it (`Payload.to_dict`), resuming and `train.init_from` read it back, and
`trainbox eval`/`predict` read its weights: all through `read`, so no reader re-derives keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainbox.checkpoint import files
from trainbox.version import __version__

# What resuming needs beyond the weights; a weights-only file can still seed `train.init_from`.
TRAINING_STATE = ("optimizer", "scheduler", "scaler", "rng")


@dataclass(frozen=True, kw_only=True, slots=True)
class Payload:
    """Everything one checkpoint holds."""

    # Optimizer steps taken when it was written.
    step: int
    # The model's state_dict (the module itself, no DDP prefix).
    model: Mapping[str, Any]
    # The whole resolved config as a dict: what resuming judges a new config against.
    config: Mapping[str, Any] = field(default_factory=dict)
    # configuration.fingerprint of that config ('' in files that predate it).
    config_hash: str = ""
    # state_dicts of the optimizer, the LR scheduler and the gradient scaler (None: absent).
    optimizer: Mapping[str, Any] | None = None
    scheduler: Mapping[str, Any] | None = None
    scaler: Mapping[str, Any] | None = None
    # Every rank's RNG states in rank order (restored when the world size is unchanged).
    rng: list[Any] | None = None
    # train.state_factory's objects' state_dicts, by name.
    extra_state: Mapping[str, Any] = field(default_factory=dict)
    # A sharded stream's position (its plan and the micro-batches taken); None: a map-style
    # dataset, whose position follows from the step.
    data_position: Mapping[str, Any] | None = None
    # The trainbox version that wrote it.
    trainbox: str = __version__
    # True: model and optimizer are DCP shards beside this record (both empty here): fsdp's.
    sharded: bool = False

    @property
    def model_config(self) -> Mapping[str, Any] | None:
        """The `model` section it was trained with (None: the file records none)."""
        return self.config.get("model")

    def missing_state(self) -> list[str]:
        """The training state it lacks, which resuming needs (none in a trainer's checkpoint)."""
        return [name for name in TRAINING_STATE if getattr(self, name) is None]

    def to_dict(self) -> dict[str, Any]:
        """What goes into the file (plain types only: it loads with weights_only=True)."""
        return {
            "step": self.step,
            "trainbox": self.trainbox,
            "config_hash": self.config_hash,
            # Older readers (and humans) find the model's config without the whole one.
            "model_config": dict(self.config.get("model", {})),
            "config": dict(self.config),
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "rng": self.rng,
            "extra_state": dict(self.extra_state),
            "sharded": self.sharded,
            "data_position": None if self.data_position is None else dict(self.data_position),
        }


# What the trainer writes under each key besides `step`; None stands for "absent" too.
_MAPPINGS = (
    "config",
    "model_config",
    "optimizer",
    "scheduler",
    "scaler",
    "extra_state",
    "data_position",
)


def shape_problems(raw: Mapping[str, Any]) -> list[str]:
    """Why a loaded file's payload is not one the trainer writes (none when it is)."""
    found = []
    step = raw.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        found.append(f"step is {_kind(step)}, not a count of steps")
    if not isinstance(raw.get("model"), Mapping):
        found.append(f"model is {_kind(raw.get('model'))}, not a mapping of tensors")
    found += [
        f"{name} is {_kind(raw[name])}, not a mapping"
        for name in _MAPPINGS
        if raw.get(name) is not None and not isinstance(raw[name], Mapping)
    ]
    inner = raw.get("config")
    if isinstance(inner, Mapping) and not isinstance(inner.get("model", {}), Mapping):
        found.append(f"config.model is {_kind(inner['model'])}, not a mapping")
    if raw.get("rng") is not None and not isinstance(raw["rng"], list):
        found.append(f"rng is {_kind(raw['rng'])}, not a list")
    return found


def _kind(value: Any) -> str:
    # A type, not a repr: a payload's value may be a tensor of any size.
    name = type(value).__name__
    return "missing" if value is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def read(raw: Mapping[str, Any]) -> Payload:
    """A loaded file's payload; files from before the whole config was kept name the model's.

    ValueError says how the payload differs from what the trainer writes.
    """
    problems = shape_problems(raw)
    if problems:
        raise ValueError("; ".join(problems))
    config = raw.get("config") or (
        {"model": raw["model_config"]} if raw.get("model_config") is not None else {}
    )
    return Payload(
        step=int(raw["step"]),
        model=raw["model"],
        config=config,
        config_hash=str(raw.get("config_hash", "")),
        optimizer=raw.get("optimizer"),
        scheduler=raw.get("scheduler"),
        scaler=raw.get("scaler"),
        rng=raw.get("rng"),
        extra_state=raw.get("extra_state") or {},
        data_position=raw.get("data_position"),
        trainbox=str(raw.get("trainbox", "")),
        sharded=raw.get("sharded") is True,
    )


def load(path: Path) -> Payload:
    """Read and check one checkpoint file (or `latest`); ValueError says why it cannot be used."""
    return read_file(path, files.load(path))


def read_file(path: Path, raw: Mapping[str, Any]) -> Payload:
    """`read` of what `path` held; its ValueError names the file."""
    try:
        return read(raw)
    except ValueError as err:
        raise ValueError(f"{path.name} is not a trainbox checkpoint ({err})") from None


def newest(directory: Path) -> tuple[Path, Payload] | None:
    """The newest checkpoint in `directory` that loads, and its payload (ValueError: not ours)."""
    found = files.newest_valid(directory)
    return None if found is None else (found[0], read_file(*found))


def misfits(
    model: Mapping[str, Any], weights: Mapping[str, Any], *, strict: bool = True
) -> list[str]:
    """Why `weights` do not load into a model whose state_dict is `model` (none when they do).

    `strict`: every tensor must be on both sides; else only those present must fit.
    """
    found = []
    shapes = [
        f"{key} {tuple(value.shape)} vs the model's {tuple(model[key].shape)}"
        for key, value in weights.items()
        if key in model and getattr(value, "shape", None) != model[key].shape
    ]
    if shapes:
        found.append(f"shapes differ: {_few(shapes)}")
    if strict:
        missing = [key for key in model if key not in weights]
        unexpected = [key for key in weights if key not in model]
        if missing:
            found.append(f"missing from the checkpoint: {_few(missing)}")
        if unexpected:
            found.append(f"not in the model: {_few(unexpected)}")
    elif not any(key in model for key in weights):
        found.append("no tensor of the checkpoint matches the model's names")
    return found


def _few(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
