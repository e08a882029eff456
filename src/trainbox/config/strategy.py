"""What the sharded strategies (fsdp, hsdp) cannot be combined with: one line per key, refused
at load."""

from __future__ import annotations

from trainbox.config.schema import Config, TrainConfig

FSDP_HINT = (
    "turn those keys off or back to their defaults, or use train.strategy=ddp"
    " (docs/fsdp.md#refused-under-fsdp); train.shard_size is for train.strategy=hsdp"
)


def fsdp_problems(train: TrainConfig) -> list[str]:
    """Why these train settings cannot run with their strategy (none when they can)."""
    problems = shard_size_problems(train)
    if not train.sharded:
        return problems
    refused = {
        "train.find_unused_parameters=true": train.find_unused_parameters,
    }
    why = {
        "train.find_unused_parameters=true": "a DDP switch that means nothing to fsdp",
    }
    return problems + [
        f"{setting} is not supported with train.strategy={train.strategy} ({why[setting]})"
        for setting, on in refused.items()
        if on
    ]


def shard_size_problems(train: TrainConfig) -> list[str]:
    """A shard size set for a strategy that has no shard groups: refused, never ignored."""
    if train.shard_size == 0 or train.strategy == "hsdp":
        return []
    return [
        f"train.shard_size={train.shard_size} means nothing with train.strategy="
        f"{train.strategy} (only hsdp shards within groups of ranks)"
    ]


RECOVERY_HINT = (
    "use dist.recovery=restart, which resumes from the newest checkpoint"
    " (docs/reliability.md#in-process-recovery)"
)


def recovery_problems(config: Config) -> list[str]:
    """Why dist.recovery=in_process cannot run with these settings (none when it can)."""
    if config.dist.recovery != "in_process":
        return []
    problems = []
    if config.train.sharded:
        # A rank's shards die with it and no peer hands a copy back (under hsdp a replica holds
        # one, but nothing fetches it from there): only the checkpoint has them.
        problems.append(
            f"dist.recovery=in_process is not supported with train.strategy={config.train.strategy}"
            " (a dead rank's shards are gone with it; fsdp recovers from its checkpoint)"
        )
    return problems
