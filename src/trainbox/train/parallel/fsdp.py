"""The model as the loop trains it under `train.strategy=fsdp`: FSDP2 (`fully_shard`) over a
1-D device mesh of every rank, one sharded unit per repeated block and one for the root; each
unit's forward checkpointed and compiled when the config asks. Under `train.strategy=hsdp` the
same over a 2-D mesh (replicate, shard): sharded within a group, replicated across (mesh.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from trainbox.errors import UsageError
from trainbox.train.parallel.blocks import compile_forward, recompute_in_backward, repeated_blocks
from trainbox.train.steps.user_code import UserFn, call

UNITS_HINT = (
    "train.fsdp_units must return a list of distinct submodules of the model it is given"
    " (the root is sharded anyway)"
)


def chosen_units(model: torch.nn.Module, units: UserFn | None) -> list[torch.nn.Module]:
    """train.fsdp_units' modules, checked (one error for all problems), or the repeated blocks."""
    if units is None:
        return repeated_blocks(model)
    given = call(units, model, args={}, key="train.fsdp_units")
    if not isinstance(given, list | tuple):
        raise UsageError(
            f"train.fsdp_units {units.name} returned {type(given).__name__}, not a list",
            hint=UNITS_HINT,
        )
    return checked_units(model, list(given), name=units.name)


def checked_units(
    model: torch.nn.Module, given: list[object], *, name: str
) -> list[torch.nn.Module]:
    """`given` as modules if each is a distinct submodule of `model`; else one UsageError."""
    inside = {id(module) for module in model.modules()}
    problems = []
    for index, unit in enumerate(given):
        if not isinstance(unit, torch.nn.Module):
            problems.append(f"item {index} is {type(unit).__name__}, not a torch.nn.Module")
        elif id(unit) not in inside:
            problems.append(f"item {index} ({type(unit).__name__}) is not part of the model")
    if len({id(unit) for unit in given}) != len(given):
        problems.append("a module is listed twice")
    if problems:
        raise UsageError([f"train.fsdp_units {name}: {text}" for text in problems], hint=UNITS_HINT)
    return [unit for unit in given if isinstance(unit, torch.nn.Module) and unit is not model]


def mixed_precision(amp_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """Parameters all-gathered in the autocast dtype; gradients always reduced in fp32."""
    return MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitOptions:
    """What is done to each sharded unit besides sharding it."""

    # Free a unit's gathered parameters after its forward (gather again for backward).
    reshard_after_forward: bool = True
    # Recompute each unit's activations in backward (train.activation_checkpointing).
    checkpointing: bool = False
    # Compile each unit's forward (train.compile).
    compiled: bool = False


def wrap(
    module: torch.nn.Module,
    device: torch.device,
    *,
    world_size: int,
    amp_dtype: torch.dtype | None,
    units: UserFn | None,
    options: UnitOptions = UnitOptions(),
    mesh_shape: tuple[int, ...] | None = None,
) -> FSDPModule:
    """Shard `module` in place over every rank: each unit innermost first, then the root.

    `mesh_shape` (replicate, shard) makes it hsdp: each unit sharded over `shard` consecutive
    ranks and replicated over the `replicate` groups; None: one dimension of `world_size`.
    """
    if mesh_shape is None or len(mesh_shape) == 1:
        mesh = init_device_mesh(device.type, (world_size,))
    else:
        assert len(mesh_shape) == 2, mesh_shape
        assert mesh_shape[0] * mesh_shape[1] == world_size, (mesh_shape, world_size)
        # Row-major: ranks r*shard .. r*shard+shard-1 form replica r's shard group.
        mesh = init_device_mesh(device.type, mesh_shape, mesh_dim_names=("replicate", "shard"))
    policy = mixed_precision(amp_dtype)
    # Deepest first: a unit inside another must be sharded before the one that holds it.
    ordered = sorted(chosen_units(module, units), key=lambda unit: -_depth(module, unit))
    # A model with no unit but the root is one block: the root's forward is the one changed.
    for block in ordered or [module]:
        prepare_forward(block, options)
    for unit in ordered:
        fully_shard(
            unit, mesh=mesh, mp_policy=policy, reshard_after_forward=options.reshard_after_forward
        )
    # The root keeps FSDP's own choice (no reshard after forward): backward needs it at once.
    fully_shard(module, mesh=mesh, mp_policy=policy)
    assert isinstance(module, FSDPModule)  # fully_shard swaps the class in place
    return module


def prepare_forward(block: torch.nn.Module, options: UnitOptions) -> None:
    """Checkpoint, then compile, `block`'s forward, as `options` ask.

    Only forward changes, never the module's call: FSDP's hooks around the call (all-gather,
    reshard) run eagerly outside the compiled code, which they would otherwise break up, and
    once, outside the recomputed part.
    """
    if options.checkpointing:
        recompute_in_backward(block)
    if options.compiled:
        compile_forward(block)


def _depth(root: torch.nn.Module, unit: torch.nn.Module) -> int:
    return next(name.count(".") + 1 for name, module in root.named_modules() if module is unit)
