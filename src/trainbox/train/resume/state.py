"""What a checkpoint captures of a run: weights, optimizer, schedule, GradScaler, the user's own
state objects (`train.state_factory`) and the step; built from the config and the user's
factories, turned into a Payload and back, and fingerprinted (`params_sha256`).

A user's state objects are {name: object with state_dict/load_state_dict}; the trainer saves each
in every checkpoint, restores it on resume and calls its optional `after_step(step)` after every
optimizer step.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from trainbox.checkpoint import shards
from trainbox.checkpoint.schema import Payload
from trainbox.config import Config
from trainbox.errors import UsageError
from trainbox.logs import log
from trainbox.train.resume.determinism import restore_rng
from trainbox.train.steps import optim
from trainbox.train.steps.functions import named_values
from trainbox.train.steps.user_code import UserCode, UserFn, call


class TrainState:
    """One rank's training state: what the loop trains with, what checkpoints save and restore."""

    def __init__(
        self,
        config: Config,
        module: torch.nn.Module,
        *,
        user_code: UserCode,
        world_size: int,
        device: torch.device,
        amp_dtype: torch.dtype | None,
    ) -> None:
        self.config, self.module, self.user_code = config, module, user_code
        self.optimizer = optim.build_optimizer(
            config, module, world_size=world_size, factory=user_code.optimizer
        )
        # optim.lr after optim.scale_lr: what the built-in schedules start from.
        self.peak_lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler = optim.build_scheduler(config, self.optimizer, factory=user_code.schedule)
        # Only fp16 needs loss scaling; disabled, the scaler passes every call straight through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
        # train.state_factory's objects; made by `make_user_state` once the weights are final.
        self.extra: dict[str, Any] = {}
        self.step = 0
        # The data's position after a step, for checkpoints (None: the step count says it all).
        self.data_position: Callable[[int], Mapping[str, Any] | None] = lambda _step: None
        # The stream position the restored checkpoint holds (None: none, or map-style data).
        self.resumed_data_position: Mapping[str, Any] | None = None
        # This rank's share of the stream's replaced corrupt samples (none for map-style data).
        self.samples_skipped: Callable[[], int] = lambda: 0

    def make_user_state(self, resumed: Payload | None, *, source: str) -> None:
        """Before the first step: train.state_factory's objects, restored when resuming."""
        self.extra = build_user_state(self.user_code.state, self.module, self.optimizer)
        if resumed is not None:
            restore_user_state(self.extra, resumed.extra_state, source=source)

    def lr(self) -> float:
        """The first param group's learning rate now (a tensor lr too)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def payload(
        self,
        *,
        config: dict[str, Any],
        config_hash: str,
        rng: list[Any],
        sharded: bool = False,
        skipped: int = 0,
    ) -> Payload:
        """This state as a checkpoint holds it (`rng`: every rank's RNG states, in rank order;
        `skipped`: the stream's replaced samples, all ranks together).

        `sharded`: without the model and optimizer, which `sharded_tensors` gives to DCP.
        """
        position = self.data_position(self.step)
        return Payload(
            step=self.step,
            config=config,
            config_hash=config_hash,
            model={} if sharded else self.module.state_dict(),
            optimizer={} if sharded else self.optimizer.state_dict(),
            sharded=sharded,
            scheduler=self.scheduler.state_dict(),
            scaler=self.scaler.state_dict(),
            rng=rng,
            extra_state=user_state_dicts(self.extra),
            data_position=None if position is None else {**position, "skipped": skipped},
        )

    def sharded_tensors(self) -> dict[str, Any]:
        """This rank's shards of the model and optimizer state, keyed as DCP saves them."""
        model, optimizer = get_state_dict(self.module, self.optimizer)
        return {shards.MODEL: model, "optimizer": optimizer}

    def restore(
        self,
        saved: Payload,
        *,
        source: str,
        changed: list[str],
        rank: int,
        world_size: int,
        rng: bool = True,
    ) -> None:
        """Load a checkpoint into this state (the user's state objects: in `make_user_state`).

        Collective for a sharded checkpoint (`source` is then its folder). `rng=False` leaves
        the RNG streams alone: a hand-over's steps seed their own.
        """
        fresh = "optim.name" in changed
        if saved.sharded:
            self._load_shards(Path(source), fresh_optimizer=fresh)
        else:
            self.module.load_state_dict(saved.model)
        optim.restore(
            self.optimizer,
            self.scheduler,
            optimizer_state=saved.optimizer,
            scheduler_state=saved.scheduler,
            source=source,
            fresh_optimizer=fresh,
            optimizer_loaded=saved.sharded,
        )
        if saved.scaler or not self.scaler.is_enabled():
            self.scaler.load_state_dict(dict(saved.scaler or {}))
        else:
            log.warning("fp16 is new to this run: the gradient scaler starts afresh")
        if self.user_code.optimizer is None and self.user_code.schedule is None:
            # A user's optimizer and schedule carry their own lrs; optim.* shapes only built-ins.
            self._apply_optim_config()
        self.step = saved.step
        self.resumed_data_position = saved.data_position
        states = saved.rng or []
        if not rng:
            return
        if len(states) == world_size:
            restore_rng(states[rank])
        else:
            log.warning(
                "world size changed since the checkpoint: RNG streams restart, so the result will"
                " differ from an uninterrupted run",
                checkpoint_world_size=len(states),
                world_size=world_size,
            )

    def _load_shards(self, path: Path, *, fresh_optimizer: bool) -> None:
        """This rank's part of a sharded checkpoint, whatever world size wrote it. Collective."""
        wanted = self.sharded_tensors()
        if fresh_optimizer:
            del wanted["optimizer"]  # DCP reads only what is asked for
        try:
            shards.load_tensors(path, wanted)
        # DCP gathers every rank's failure into one CheckpointException, a BaseException.
        except (Exception, CheckpointException) as err:
            raise UsageError(
                f"{path} does not fit this run's model or optimizer:"
                f" {' '.join(str(err).split())[:300]}",
                hint="resume with the model and optimizer the run was started with, or start a"
                " new run_dir",
            ) from err
        set_model_state_dict(self.module, wanted[shards.MODEL])
        if not fresh_optimizer:
            set_optimizer_state_dict(self.module, self.optimizer, wanted["optimizer"])

    def _apply_optim_config(self) -> None:
        """This config's lr, schedule and decay over the restored state (which carries its own).

        Unchanged values give the very floats the restored state holds, so a plain resume stays
        bit-identical; a changed (allowed) value takes effect at once. The scheduler's last lr
        catches up at its next step, before anything reads it.
        """
        settings, scheduler, groups = self.config.optim, self.scheduler, self.optimizer.param_groups
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            raise TypeError(f"the built-in schedule is a LambdaLR, not {type(scheduler).__name__}")
        factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
        scheduler.base_lrs = [self.peak_lr for _ in groups]
        for group in groups:
            group["initial_lr"] = self.peak_lr
            group["lr"] = self.peak_lr * factor
            group["weight_decay"] = settings.weight_decay
            if settings.name == "sgd":
                group["momentum"] = settings.momentum


def params_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer in name order: the reproducibility fingerprint.

    Collective for a sharded model: each tensor is gathered whole on every rank in turn, so the
    value is the same at every world size and the peak cost is one full tensor at a time.
    """
    return tensors_sha256(model.state_dict())


def tensors_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    """`params_sha256` of a state_dict (sharded tensors gathered one at a time, in name order)."""
    digest = hashlib.sha256()
    for name, value in sorted(tensors.items()):
        tensor = value.full_tensor() if isinstance(value, DTensor) else value
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        # Raw bytes in row-major order; viewing as uint8 first also covers bf16, which NumPy lacks.
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest.update(flat.numpy().tobytes())
    return digest.hexdigest()


USER_STATE_HINT = (
    "return {name: object} where each object has state_dict() and load_state_dict(state),"
    " and optionally after_step(step)"
)


def build_user_state(
    factory: UserFn | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """The user's state objects, checked; {} without a factory."""
    if factory is None:
        return {}
    states = named_values(
        call(factory, model, optimizer, args={}, key="train.state_factory"),
        who=f"train.state_factory {factory.name}",
        wanted="a dict",
        fits=lambda obj: (
            callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ),
        unfit="objects without state_dict and load_state_dict",
        hint=USER_STATE_HINT,
        allow_empty=True,
        show=lambda obj: type(obj).__name__,
    )
    # Checked on every rank before training: a checkpoint holding other types would fail
    # `weights_only` loading and look damaged, so a resume would silently start over.
    unsafe = [
        f"{name!r} at {where}: {kind}"
        for name, obj in states.items()
        for where, kind in unloadable(obj.state_dict())
    ]
    if unsafe:
        raise UsageError(
            f"train.state_factory {factory.name}: state_dict() holds values a checkpoint cannot"
            f" load back: {', '.join(unsafe[:4])}",
            hint="keep states to tensors, numbers, strings, None and lists/tuples/dicts of them"
            " (under fsdp, whole tensors: a parameter's .full_tensor(), not its shard)",
        )
    return dict(states)


def unloadable(value: Any, where: str = "state") -> list[tuple[str, str]]:
    """(path, type) of every leaf `torch.load(weights_only=True)` would refuse.

    A DTensor is one too: a checkpoint keeps rank 0's user state, and that would be its shard.
    """
    if isinstance(value, DTensor):
        return [(where, "DTensor")]
    if isinstance(value, torch.Tensor | int | float | bool | str | bytes | type(None)):
        return []
    if isinstance(value, torch.dtype | torch.device | torch.Size):
        return []
    if type(value) in (dict, OrderedDict):
        return [
            found
            for key, item in value.items()
            for found in [*unloadable(key, f"{where} key"), *unloadable(item, f"{where}[{key!r}]")]
        ]
    if type(value) in (list, tuple):
        return [
            found for i, item in enumerate(value) for found in unloadable(item, f"{where}[{i}]")
        ]
    return [(where, type(value).__name__)]


def user_state_dicts(states: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds of them."""
    return {name: obj.state_dict() for name, obj in states.items()}


def restore_user_state(
    states: Mapping[str, Any], saved: Mapping[str, Any] | None, *, source: str
) -> None:
    """Load each object's saved state; names missing on either side are one error."""
    saved = saved or {}
    missing = sorted(set(states) - set(saved))
    extra = sorted(set(saved) - set(states))
    problems = []
    if missing:
        problems.append(f"{source} holds no train.state_factory state for {', '.join(missing)}")
    if extra:
        problems.append(f"{source} holds state for {', '.join(extra)}, which this run lacks")
    for name in sorted(set(states) & set(saved)):
        try:
            states[name].load_state_dict(saved[name])
        except (KeyError, ValueError, TypeError, RuntimeError) as err:
            reason = " ".join(str(err).split())[:200]
            problems.append(f"state {name!r} cannot be restored ({type(err).__name__}: {reason})")
    if problems:
        raise UsageError(
            problems,
            hint="resume with the train.state_factory the run was started with, or start a new"
            " run_dir",
        )


def user_state_after_step(states: Mapping[str, Any], step: int) -> None:
    """Each object's `after_step(step)`, where it has one."""
    for obj in states.values():
        hook = getattr(obj, "after_step", None)
        if hook is not None:
            hook(step)
