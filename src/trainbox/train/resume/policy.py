"""Which config keys a resumed run may change, and why: the one table, and the judge that reads it.

A key is named exactly (`train.max_steps`) or by its section (`dist.` covers every dist key).
The longest matching entry wins. A key that no entry matches needs consent, so a new config key
is safe until someone decides otherwise (a unit test checks that every key has a rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Changes a resumed run takes as they come: they change how the run is watched or housed, or
# how long it goes on, never what the checkpoint's state means.
MAY_CHANGE: Mapping[str, str] = {
    "name": "a label; run_dir says where the run lives",
    "run_dir": "the directory may have moved or be mounted elsewhere",
    # The cosine schedule follows the new length from the resumed step on.
    "train.max_steps": "training longer (or stopping sooner) is why many runs resume",
    "train.log_every": "logging only",
    "train.eval_every": "evaluation only reads the model",
    "train.ckpt_every": "when state is saved, not what it is",
    "train.keep_last": "how many checkpoints stay on disk",
    "train.async_save": "how checkpoints are written, not what they hold",
    "train.deadline_margin_s": "when a preempted run stops",
    "train.resume": "how this run finds its checkpoint",
    "train.resume_changes": "the consent itself",
    "train.deterministic": "which kernels run; the state stays the same",
    "train.compile": "the same model, compiled or not",
    "train.find_unused_parameters": "DDP bookkeeping",
    # Sharded checkpoints are keyed by parameter name, and any layout loads any other.
    "train.fsdp_units": "which modules fsdp shards as units, not what the state is",
    "train.fsdp_reshard_after_forward": "when gathered parameters are freed, not their values",
    "train.shard_size": "how many ranks share one copy of the shards, not what they hold",
    "train.activation_checkpointing": "activations are recomputed, not changed",
    "train.eval_step": "evaluation only reads the model",
    "train.predict_step": "prediction only reads the model",
    # A resumed run restores its own checkpoint; these shape only a run's first start.
    "train.init_from": "read only when a run starts without checkpoints of its own",
    "train.init_prefix": "read only when a run starts without checkpoints of its own",
    "train.init_strict": "read only when a run starts without checkpoints of its own",
    # A new world size is handled where the RNG streams are restored (with a warning).
    "dist.": "how the processes meet",
    "dist.flight_recorder_entries": "what NCCL records for a hang's evidence, not the training",
    "preflight.": "checks before training",
    "pinning.": "CPUs, threads and DataLoader workers",
    "logging.": "where metrics are also sent; the training is the same",
    "health.": "what is watched while training; the training is the same",
    "storage.": "how long the store may take, not what it holds",
}

# Changes that need train.resume_changes=allow: the checkpoint's state was made for the old
# value, or the run would quietly become another run.
NEEDS_CONSENT: Mapping[str, str] = {
    "seed": "the data order after the resume would no longer be this run's",
    "model.": "the weights belong to the old model; another shape does not load at all",
    "data.": "the run would go on with other data",
    "train.batch_size": "the data position and the effective learning rate count in batches",
    "train.grad_accum": "the data position and the effective learning rate count in batches",
    "train.amp": "the GradScaler state and the numerics belong to the old precision",
    "train.clip_grad_norm": "part of how the optimizer steps",
    # Even with consent a run reads only its own kind of checkpoint (resume.py refuses the other).
    "train.strategy": "ddp writes one file per checkpoint, fsdp and hsdp a folder of shards",
    "train.loss": "the objective itself",
    "train.step": "the objective itself",
    "train.state_factory": "the saved extra state belongs to the old factory's objects",
    "optim.": "the optimizer state and the learning-rate schedule were built for the old values",
}

UNSET = "(unset)"

# Values of a key among which a resumed run may move freely, though the key itself needs
# consent: fsdp and hsdp write the same sharded checkpoints, which load into either layout.
INTERCHANGEABLE: Mapping[str, frozenset[Any]] = {
    "train.strategy": frozenset({"fsdp", "hsdp"}),
}


def rule_for(key: str) -> tuple[bool, str]:
    """Whether `key` may change without consent, and why (longest matching entry wins)."""
    best: tuple[int, bool, str] = (-1, False, "no rule names this key")
    for table, allowed in ((MAY_CHANGE, True), (NEEDS_CONSENT, False)):
        for name, why in table.items():
            matches = key == name or (name.endswith(".") and key.startswith(name))
            if matches and len(name) > best[0]:
                best = (len(name), allowed, why)
    return best[1], best[2]


def judge_resume(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`key: old -> new` for each changed key that needs consent, in key order."""
    before, after = flatten(old), flatten(new)
    problems = []
    for key in sorted(before.keys() | after.keys()):
        was, now = before.get(key, UNSET), after.get(key, UNSET)
        if was != now and not rule_for(key)[0] and not _interchangeable(key, was, now):
            problems.append(f"{key}: {_show(was)} -> {_show(now)}")
    return problems


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Every changed key, allowed or not, in key order."""
    before, after = flatten(old), flatten(new)
    keys = sorted(before.keys() | after.keys())
    return [key for key in keys if before.get(key, UNSET) != after.get(key, UNSET)]


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: {"optim": {"lr": 1}} -> {"optim.lr": 1}."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _interchangeable(key: str, was: Any, now: Any) -> bool:
    values = INTERCHANGEABLE.get(key, frozenset())
    return was in values and now in values


def _show(value: Any) -> str:
    return value if value is UNSET else repr(value)
