"""The model's repeated blocks, and what each block's forward can be made to do: recompute its
activations in backward (activation checkpointing), or run compiled."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """In every ModuleList or Sequential, the children holding parameters, when there are at
    least two and all of one class; outermost first, none inside another."""
    found: list[torch.nn.Module] = []
    taken: set[int] = set()
    for module in model.modules():
        if id(module) in taken or not isinstance(module, CONTAINERS):
            continue
        holders = [child for child in module.children() if _holds_parameters(child)]
        if len(holders) >= 2 and len({type(child) for child in holders}) == 1:
            found += holders
            taken.update(id(inner) for child in holders for inner in child.modules())
    return found


def _holds_parameters(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def recompute_in_backward(block: torch.nn.Module) -> None:
    """Make `block`'s forward keep only its inputs and recompute the rest in backward.

    Only forward itself is wrapped, so hooks around the call (fsdp's all-gather and reshard)
    run once, outside. Non-reentrant checkpointing replays the saved RNG state, so a recomputed
    dropout draws what the first forward drew.
    """
    forward = block.forward

    @functools.wraps(forward)
    def recomputed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing is kept for a backward anyway
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    # On the instance, not the class: parameter names and state-dict keys stay as they are.
    block.forward = recomputed


def compile_forward(block: torch.nn.Module) -> None:
    """Compile `block`'s forward in place (its parameter names stay as they are)."""
    block.forward = torch.compile(block.forward)
