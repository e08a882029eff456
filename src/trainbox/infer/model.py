"""A model and a dataset from a checkpoint and a config, and how eval and predict run it: the
trainer's precision and the DataLoader workers the CPU plan allows. Every problem is collected."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from trainbox.affinity import loader
from trainbox.checkpoint import files, schema, shards
from trainbox.checkpoint.schema import Payload
from trainbox.config import Config, PinningConfig, as_dict, factories
from trainbox.distributed import consensus
from trainbox.distributed.consensus import Problem
from trainbox.distributed.process_group import Session
from trainbox.errors import UsageError
from trainbox.infer import locate
from trainbox.logs import log
from trainbox.train.data import contract
from trainbox.train.resume.determinism import seed_all
from trainbox.train.steps import functions
from trainbox.train.steps.functions import loss_fn


@dataclass(frozen=True, kw_only=True, slots=True)
class Loaded:
    """What eval and predict run: a trained model over one split of the data."""

    # The checkpoint file, or sharded checkpoint folder, read (a `latest` link resolved).
    checkpoint: Path
    # SHA-256 of that file (of a folder: of its manifest, which lists every file's SHA-256):
    # names the weights in predict's restart manifest.
    sha256: str
    # The optimizer step it was saved after.
    step: int
    # The model with the checkpoint's weights, on the device, in eval mode.
    model: torch.nn.Module
    # The split's map-style dataset of (inputs, target) pairs.
    dataset: Any
    # Most DataLoader workers worth using (the data factory's word; None: no limit).
    max_workers: int | None


def config_problem(path: Path, theirs: Mapping[str, Any] | None, config: Config) -> Problem | None:
    """The checkpoint's model config differs from the config given (None: it records none).

    A run trained through the Python API records no factory (`<api>`): any the user names may
    build its model, and loading the weights checks that they fit.
    """
    ours = as_dict(config)["model"]
    if theirs is None or theirs == ours or theirs.get("factory") == factories.API_SUPPLIED:
        return None
    return Problem(
        text=f"--checkpoint {str(path)!r} was made with model config {dict(theirs)}, the config"
        f" given has {ours}",
        hint="evaluate with the run's own config (--config RUN_DIR/config.yaml, the default for a"
        " checkpoint inside its run) and drop model.* overrides",
    )


def unreadable(path: Path, err: ValueError) -> str:
    """Why the checkpoint did not load, in a line: torch's own message runs to paragraphs."""
    cause = err.__cause__
    if cause is None:
        return f"--checkpoint {str(path)!r}: {err}"
    first = str(cause).strip().split("\n")[0].split(". ")[0].rstrip(".")
    return (
        f"--checkpoint {str(path)!r} is not a checkpoint torch can read"
        f" ({type(cause).__name__}: {first})"
    )


def load(
    config: Config,
    path: Path,
    *,
    split: str,
    device: torch.device,
    problems: list[Problem],
    probe: bool = True,
) -> Loaded | None:
    """Read, check and build; None (with `problems` added to) when anything does not fit.

    `probe`: send a batch of `(inputs, targets)` through the model and `train.loss` first; off
    when a user's step reads the batches (they may be dicts), which then finds misfits itself.
    """
    # Read a `latest` link once: it may move on, its old target stays whole.
    target = path.parent / os.readlink(path) if path.is_symlink() else path
    payload = _checkpoint(config, path, target, problems)
    if payload is None:
        return None
    built = _built(config, split, problems)
    if built is None:
        return None
    model, data, dataset = built
    try:
        load_weights(model, target, payload)
        if probe and not _fits(config, model, dataset, split, problems):
            return None
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        problems.append(
            Problem(
                text=f"--checkpoint {str(path)!r} does not load into model.factory="
                f"{config.model.factory!r}: {first}",
                hint="use the model factory and code the checkpoint was trained with",
            )
        )
        return None
    return Loaded(
        checkpoint=target,
        sha256=files.digest(target / shards.MANIFEST if payload.sharded else target),
        step=payload.step,
        model=model.to(device).eval(),
        dataset=dataset,
        max_workers=data.max_workers,
    )


def _checkpoint(
    config: Config, path: Path, target: Path, problems: list[Problem]
) -> Payload | None:
    """The checkpoint's payload, once it is whole, readable and made with this model config."""
    missing = locate.checkpoint_problem(path)
    # Before any rank may return: checking a sharded checkpoint is collective.
    damaged = sharded_problem(path, target, readable=missing is None)
    found = missing or damaged
    if found is not None:
        problems.append(found)
        return None
    try:
        payload = _read(target)
    except ValueError as err:
        problems.append(Problem(text=unreadable(path, err), hint=locate.CHECKPOINT_HINT))
        return None
    mismatch = config_problem(target, payload.model_config, config)
    if mismatch is not None:
        problems.append(mismatch)
        return None
    if payload.model_config is None:
        log.warning("checkpoint records no model config; not checked", checkpoint=str(target))
    return payload


def _built(
    config: Config, split: str, problems: list[Problem]
) -> tuple[torch.nn.Module, contract.Datasets, Any] | None:
    """(model, data, the split's dataset) from the factories, as the trainer builds them."""
    try:
        # As the trainer does: the factories may draw random numbers.
        seed_all(config.seed)
        model = factories.build_model(config.model.factory, config.model.args)
        data = contract.build_data(config.data.factory, config.data.args)
    except UsageError as err:
        problems += [Problem(text=text, hint=err.hint) for text in err.problems]
        return None
    dataset = data.val if split == "val" else data.train
    if dataset is None:
        problems.append(
            Problem(
                text=f"data.factory={config.data.factory!r} returns no validation set",
                hint="return Datasets(train=..., val=...) from the data factory, or use"
                " --split train",
            )
        )
        return None
    return model, data, dataset


def _fits(
    config: Config, model: torch.nn.Module, dataset: Any, split: str, problems: list[Problem]
) -> bool:
    """Whether a batch of the split goes through the model and `train.loss`."""
    if not _is_pair(dataset[0]):
        problems.append(
            Problem(
                text=f"the {split} split's samples are {type(dataset[0]).__name__}, not the"
                " (inputs, target) pairs the built-in metrics and columns read",
                hint="set train.eval_step (eval) or train.predict_step (predict) to a function"
                " that reads your batches (docs/eval-predict.md)",
            )
        )
        return False
    try:
        contract.check_fit(
            model,
            contract.Datasets(train=dataset),
            loss=lambda out, target: loss_fn(config.train.loss, out, target),
        )
    except UsageError as err:
        problems += [
            Problem(text=f"the {split} split: {text}", hint=err.hint) for text in err.problems
        ]
        return False
    return True


def sharded_problem(path: Path, target: Path, *, readable: bool) -> Problem | None:
    """Why the sharded checkpoint `target` is not whole (None: it is, or it is a file). Collective.

    Rank 0 says whether it is sharded; then every rank checks its share of the manifest's files.
    """
    if not consensus.from_rank0(readable and locate.is_sharded(target)):
        return None
    reason = shards.check(
        target, rank=torch_dist.get_rank(), world_size=torch_dist.get_world_size()
    )
    if reason is None:
        return None
    return Problem(
        text=f"--checkpoint {str(path)!r} cannot be used: {reason}",
        hint="name an older checkpoint (ls the checkpoints folder), or train again to write one",
    )


def _read(target: Path) -> Payload:
    """The checkpoint's payload: a file's, or a sharded folder's record (its tensors stay)."""
    if locate.is_sharded(target):
        return schema.read_file(target, shards.read_record(target))
    return schema.load(target)


def load_weights(model: torch.nn.Module, target: Path, payload: Payload) -> None:
    """The checkpoint's weights into the whole, unsharded `model`; RuntimeError says what misfits.

    A sharded checkpoint is read whole in this process: each tensor from every rank's file.
    """
    if not payload.sharded:
        model.load_state_dict(payload.model)
        return
    try:
        layout = shards.model_layout(target, torch.device("meta"))
        misfit = schema.misfits(model.state_dict(), layout)
        if not misfit:
            shards.read_model(target, model.state_dict())
    except ValueError as err:
        misfit = [str(err)]
    if misfit:
        raise RuntimeError("; ".join(misfit))


def _is_pair(sample: Any) -> bool:
    return isinstance(sample, tuple | list) and len(sample) == 2


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The trainer's mixed precision for `train.amp` (auto: bf16 on a GPU that has it)."""
    # The trainer's own rule, so a checkpoint is evaluated in the precision it trained in.
    return functions.autocast(functions.amp_dtype(amp, device), device)


def loader_workers(session: Session, max_workers: int | None, pinning: PinningConfig) -> int:
    """Workers for a dataset capped at `max_workers`; CPUs they would waste go to threads."""
    plan = loader.size_threads(
        session.plan,
        max_workers,
        auto_workers=pinning.num_workers == "auto",
        auto_threads=pinning.num_threads == "auto",
    )
    return plan.num_workers if plan else 0
