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
        "train.compile=true": train.compile,
        "train.amp=fp16": train.amp == "fp16",
        "train.find_unused_parameters=true": train.find_unused_parameters,
    }
    why = {
        "train.compile=true": "compiling a sharded model",
        "train.amp=fp16": "fp16 loss scaling over sharded gradients (bf16 works)",
        "train.find_unused_parameters=true": "a DDP switch that means nothing to fsdp",
    }
    return [
        f"{setting} is not supported with train.strategy=fsdp yet"
        f" ({why.get(setting, 'loading whole-model state into a sharded model')})"
        for setting, on in refused.items()
        if on
    ]
