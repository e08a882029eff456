"""What `train.strategy=fsdp` cannot be combined with yet: one line per key, refused at load."""

from __future__ import annotations

from trainbox.config.schema import TrainConfig

FSDP_HINT = (
    "turn those keys off or back to their defaults, or use train.strategy=ddp"
    " (docs/fsdp.md#not-yet-supported)"
)


def fsdp_problems(train: TrainConfig) -> list[str]:
    """Why these train settings cannot run with fsdp (none for ddp, or when they can)."""
    if train.strategy != "fsdp":
        return []
    refused = {
        "train.async_save=true": train.async_save,
        "train.find_unused_parameters=true": train.find_unused_parameters,
        f"train.init_from={train.init_from!r}": bool(train.init_from),
        f"train.state_factory={train.state_factory!r}": bool(train.state_factory),
    }
    why = {
        "train.async_save=true": "writing sharded checkpoints in the background",
        "train.find_unused_parameters=true": "a DDP switch that means nothing to fsdp",
    }
    return [
        f"{setting} is not supported with train.strategy=fsdp yet"
        f" ({why.get(setting, 'loading whole-model state into a sharded model')})"
        for setting, on in refused.items()
        if on
    ]
