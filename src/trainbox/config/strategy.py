"""What `train.strategy=fsdp` cannot be combined with: one line per key, refused at load."""

from __future__ import annotations

from trainbox.config.schema import TrainConfig

FSDP_HINT = (
    "turn those keys off or back to their defaults, or use train.strategy=ddp"
    " (docs/fsdp.md#refused-under-fsdp)"
)


def fsdp_problems(train: TrainConfig) -> list[str]:
    """Why these train settings cannot run with fsdp (none for ddp, or when they can)."""
    if train.strategy != "fsdp":
        return []
    refused = {
        "train.find_unused_parameters=true": train.find_unused_parameters,
    }
    why = {
        "train.find_unused_parameters=true": "a DDP switch that means nothing to fsdp",
    }
    return [
        f"{setting} is not supported with train.strategy=fsdp ({why[setting]})"
        for setting, on in refused.items()
        if on
    ]
