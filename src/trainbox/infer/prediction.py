"""`trainbox predict`: one row per input, in input order, in one file, however many ranks ran.

Chunks of input indices are dealt to the ranks round by round; rank 0 gathers each round's rows
and makes every chunk a durable part file, so a killed run redoes only the missing chunks. The
merge writes a temp file and renames it: the final name never holds half an output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from torch.utils.data import DataLoader, default_collate

from trainbox.config import Config
from trainbox.distributed import consensus
from trainbox.distributed.consensus import Problem
from trainbox.distributed.process_group import Session
from trainbox.errors import StorageError, UsageError
from trainbox.infer import (
    chunks,
    columns,
    locate,
    model,
    part_files,
    rows,
)
from trainbox.infer.chunks import Chunk
from trainbox.infer.columns import Column
from trainbox.infer.model import Loaded
from trainbox.logs import log
from trainbox.testing import predict_faults
from trainbox.train.data import batches
from trainbox.train.data.map_style import IndexSampler
from trainbox.train.data.workers import CheckedLoader, stuck_after
from trainbox.train.steps.functions import Step

STORAGE_HINT = (
    "free space there or choose another --output; rerun the same command and it keeps the parts"
    " already written"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class PredictRequest:
    """What `trainbox predict` was asked for."""

    # The checkpoint file (or `latest` link) whose model predicts.
    checkpoint: Path
    # The output file; its extension (.csv, .jsonl) picks the format.
    output: Path
    # Which dataset of the data factory: `val` or `train`.
    split: str = "val"
    # Replace an existing output file.
    force: bool = False
    # Inputs per part file: the unit of work a rerun can skip.
    chunk_size: int = 1024


def run(config: Config, here: Session, request: PredictRequest) -> dict[str, Any]:
    """Predict on every rank; rank 0 writes the parts and merges them into the output."""
    kill = predict_faults.parse(os.environ)
    job = _checked_job(config, here, request)
    planned = chunks.plan(len(job.loaded.dataset), request.chunk_size)
    directory = part_files.directory_for(request.output)
    wanted = _wanted(config, request, job)
    reused, failure = consensus.from_rank0(
        _open_parts(directory, wanted, planned, job.fmt) if here.rank0 else None
    )
    _raise_storage(failure)
    kept = set(reused)
    pending = [chunk.number for chunk in planned if chunk.number not in kept]
    if here.rank0:
        log.info("prediction parts", chunks=len(planned), reused=reused, computing=pending)
    _compute(config, here, job, planned=planned, pending=pending, directory=directory, kill=kill)
    # Still together: every rank learns whether rank 0's merge worked, and exits alike.
    failure = (
        _merge(request.output, directory, planned, job.fmt, job.header, kill)
        if here.rank0
        else None
    )
    _raise_storage(consensus.from_rank0(failure))
    result = {
        "output": str(request.output),
        "rows": len(job.loaded.dataset),
        "split": request.split,
        "checkpoint": str(job.loaded.checkpoint),
        "step": job.loaded.step,
        "chunks": len(planned),
        "reused": len(reused),
    }
    if here.rank0:
        log.info("predicted", **result)
    return result


@dataclass(frozen=True, kw_only=True, slots=True)
class _Job:
    """What every rank predicts with, once every rank's checks passed."""

    # The checkpoint's model, and the dataset of the requested split.
    loaded: Loaded
    # The user's predict step; None for the built-in columns.
    step: Step | None
    # The user step's columns, from the first sample; empty for the built-in columns.
    layout: tuple[Column, ...]
    # The output's format, from its extension: csv or jsonl.
    fmt: str
    # The output's first line; empty for JSONL.
    header: bytes
    # Values per row of the data's own target, written beside the built-in columns (0: none).
    target_width: int = 0


def _checked_job(config: Config, here: Session, request: PredictRequest) -> _Job:
    """Load and check on every rank; any rank's problem stops every rank with all of them."""
    kind = config.train.loss
    problems: list[Problem] = []
    wrong_format = locate.format_problem(request.output)
    if wrong_format is not None:
        problems.append(wrong_format)
    if here.rank0:
        problems += locate.destination_problems(request.output, force=request.force)
    step = _step(config, problems)
    # A user's predict step takes its own batches apart: the built-in probe would not fit.
    loaded = model.load(
        config,
        request.checkpoint,
        split=request.split,
        device=here.device,
        problems=problems,
        probe=step is None,
    )
    width = target_width = 0
    layout: tuple[Column, ...] = ()
    if loaded is not None and step is None:
        width = _width(loaded, kind, here, config.train.amp, problems)
        target_width = _target_width(loaded.dataset[0][1])
    elif loaded is not None and step is not None:
        layout = _probe(loaded, step, here, config.train.amp, problems)
    consensus.raise_together(problems)
    assert loaded is not None  # no rank had a problem, so this one loaded
    fmt = locate.output_format(request.output) or "csv"
    widths = {column.name: column.width for column in layout}
    header = (
        rows.header(fmt, kind, width, target_width=target_width)
        if step is None
        else rows.step_header(fmt, widths)
    )
    return _Job(loaded=loaded, step=step, layout=layout, fmt=fmt, header=header,
                target_width=target_width)  # fmt: skip


def _wanted(config: Config, request: PredictRequest, job: _Job) -> dict[str, Any]:
    """What the part files must have been made from for a rerun to reuse them."""
    return chunks.manifest(
        checkpoint_sha256=job.loaded.sha256,
        split=request.split,
        size=len(job.loaded.dataset),
        chunk_size=request.chunk_size,
        output_format=job.fmt,
        loss=config.train.loss,
        batch_size=config.train.batch_size,
        amp=config.train.amp,
        data={"factory": config.data.factory, "args": config.data.args},
        predict_step=config.train.predict_step,
    )


def _compute(
    config: Config,
    here: Session,
    job: _Job,
    *,
    planned: list[Chunk],
    pending: list[int],
    directory: Path,
    kill: predict_faults.KillPoint,
) -> None:
    """Deal the pending chunks round by round; rank 0 writes each round's parts."""
    workers = model.loader_workers(here, job.loaded.max_workers, config.pinning)
    written = 0
    for dealt in chunks.rounds(pending, world_size=here.context.world_size):
        mine = dealt[here.context.rank]
        text = _agreed_rows(
            job.loaded,
            None if mine is None else planned[mine],
            step=job.step,
            layout=job.layout,
            target_width=job.target_width,
            kind=config.train.loss,
            fmt=job.fmt,
            batch_size=config.train.batch_size,
            here=here,
            amp=config.train.amp,
            workers=workers,
            stuck_after_s=stuck_after(config.dist.timeout_s),
        )
        gathered: list[Any] | None = [None] * here.context.world_size if here.rank0 else None
        torch_dist.gather_object((mine, text), gathered, dst=0)
        failure = None
        if gathered is not None:
            failure, written = _write_round(directory, gathered, job.fmt, written, kill)
        # Every rank learns whether rank 0's writes worked, or the others would wait for it.
        _raise_storage(consensus.from_rank0(failure))


def _raise_storage(failure: str | None) -> None:
    """Stop with rank 0's storage failure, which every rank has learned."""
    if failure is not None:
        raise StorageError(failure, hint=STORAGE_HINT)


def _width(loaded: Loaded, kind: str, here: Session, amp: str, problems: list[Problem]) -> int:
    """Numbers per row (classes, or regression outputs), from one sample; checks the shape."""
    inputs, _ = default_collate([loaded.dataset[0]])
    with torch.no_grad(), model.autocast(amp, here.device):
        outputs = loaded.model(inputs.to(here.device))
    if kind == "cross_entropy" and outputs.dim() != 2:
        problems.append(
            Problem(
                text=f"predict needs class logits of shape (batch, classes) from the model;"
                f" it returns {tuple(outputs.shape)} for a batch of one",
                hint="predict per-sample classes only; for other outputs use train.loss=mse",
            )
        )
    return int(outputs.reshape(outputs.shape[0], -1).shape[1])


def _target_width(target: Any) -> int:
    """Values per row of one sample's target: 0 when it holds no numbers to write (no labels)."""
    try:
        batch = default_collate([target])
    except (TypeError, RuntimeError):
        return 0
    if not isinstance(batch, torch.Tensor) or batch.is_complex():
        return 0
    return int(batch.reshape(1, -1).shape[1])


def _agreed_rows(loaded: Loaded, chunk: Chunk | None, *, step: Step | None, here: Session,
                 **how: Any) -> bytes | None:  # fmt: skip
    """This rank's rows of a round (None: no chunk); a user step's bad return stops all ranks."""
    text, wrong = None, []
    try:
        if chunk is not None:
            text = _predict(loaded, chunk, step=step, here=here, **how)
    except UsageError as err:
        if step is None:
            raise
        wrong = [Problem(text=line, hint=err.hint) for line in err.problems]
    if step is not None:
        # Collective: the ranks whose batches were fine learn of it and exit 2 alike.
        consensus.raise_together(wrong)
    return text


@torch.no_grad()
def _predict(
    loaded: Loaded,
    chunk: Chunk,
    *,
    step: Step | None,
    layout: tuple[Column, ...],
    target_width: int,
    kind: str,
    fmt: str,
    batch_size: int,
    here: Session,
    amp: str,
    workers: int,
    stuck_after_s: float,
) -> bytes:
    """The rows of one chunk. Batches start at the chunk's start, so no world size changes them."""
    loader = CheckedLoader(
        lambda init: DataLoader(
            loaded.dataset,
            batch_size=batch_size,
            sampler=IndexSampler(range(chunk.start, chunk.stop)),
            num_workers=workers,
            worker_init_fn=init,
            collate_fn=batches.collate,
        ),
        stuck_after_s=stuck_after_s,
    )
    pieces = []
    start = chunk.start
    for batch in loader:
        if step is None:
            count, piece = _builtin_rows(loaded, batch, start, kind=kind, fmt=fmt, here=here,
                                         amp=amp, with_targets=target_width > 0)  # fmt: skip
        else:
            found, count = _run_step(loaded, batch, step, here, amp)
            columns.check_schema(step, found, layout)
            piece = rows.render_table(fmt, indices=range(start, start + count), table=found)
        pieces.append(piece)
        start += count
    return b"".join(pieces)


def _builtin_rows(
    loaded: Loaded,
    batch: Any,
    start: int,
    *,
    kind: str,
    fmt: str,
    here: Session,
    amp: str,
    with_targets: bool,
) -> tuple[int, bytes]:
    """(samples, rows) of one `(inputs, targets)` batch: the columns for `train.loss`, and the
    targets beside them when `with_targets` (the data has labels)."""
    inputs, targets = batch
    with model.autocast(amp, here.device):
        outputs = loaded.model(inputs.to(here.device))
    outputs = outputs.float().reshape(outputs.shape[0], -1)
    count = outputs.shape[0]
    if kind == "cross_entropy":
        classes = outputs.argmax(dim=-1).tolist()
        values = torch.softmax(outputs, dim=-1).tolist()
    else:
        classes, values = None, outputs.tolist()
    truth = _plain(targets, count) if with_targets else None
    indices = range(start, start + count)
    return count, rows.render(fmt, indices=indices, values=values, classes=classes, targets=truth)


def _plain(targets: Any, count: int) -> list[list[Any]]:
    """A batch's targets as plain numbers per row: integers as they are, floats in float64."""
    flat = torch.as_tensor(targets).detach().reshape(count, -1).cpu()
    return (flat.double() if flat.is_floating_point() else flat).tolist()


def _step(config: Config, problems: list[Problem]) -> Step | None:
    """`train.predict_step` (None: the built-in columns; a problem if it cannot be imported)."""
    if not config.train.predict_step:
        return None
    try:
        return columns.predict_step(config.train.predict_step)
    except UsageError as err:
        problems += [Problem(text=text, hint=err.hint) for text in err.problems]
        return None


def _probe(
    loaded: Loaded, step: Step, here: Session, amp: str, problems: list[Problem]
) -> tuple[Column, ...]:
    """The user step's columns for the first sample: the header at every world size."""
    try:
        found, _ = _run_step(loaded, batches.collate([loaded.dataset[0]]), step, here, amp)
    except UsageError as err:
        problems += [Problem(text=text, hint=err.hint) for text in err.problems]
        return ()
    layout = columns.schema(found)
    clash = columns.clashes(step, rows.step_columns({c.name: c.width for c in layout}))
    if clash is not None:
        problems += [Problem(text=text, hint=clash.hint) for text in clash.problems]
    return layout


@torch.no_grad()
def _run_step(
    loaded: Loaded, batch: Any, step: Step, here: Session, amp: str
) -> tuple[columns.Table, int]:
    """The user step's checked columns for one batch of any nesting, and its samples."""
    batch = batches.to_device(batch, here.device)
    count = batches.sample_count(batch)
    with model.autocast(amp, here.device):
        result = step.fn(loaded.model, batch)
    return columns.table(step, result, count=count), count


def _open_parts(
    directory: Path, wanted: dict[str, Any], chunks: list[Chunk], fmt: str
) -> tuple[list[int], str | None]:
    """Rank 0: (chunks whose parts are reused, what failed or None)."""
    try:
        return part_files.reusable(directory, wanted, chunks, fmt), None
    except OSError as err:
        return [], f"could not prepare {str(directory)!r}: {err.strerror or err}"


def _write_round(
    directory: Path,
    gathered: list[Any],
    fmt: str,
    written: int,
    kill: predict_faults.KillPoint,
) -> tuple[str | None, int]:
    """Rank 0: make this round's parts durable; (what failed or None, parts written so far)."""
    numbers = []
    for number, text in gathered:
        if number is None:
            continue
        try:
            part_files.write_part(directory, number, fmt, text)
        except OSError as err:
            return f"could not write part {number} in {str(directory)!r}: {err.strerror}", written
        written += 1
        numbers.append(number)
        if kill.parts == written:
            predict_faults.die()
    log.info("prediction parts written", parts=numbers)
    return None, written


def _merge(
    output: Path,
    directory: Path,
    chunks: list[Chunk],
    fmt: str,
    header: bytes,
    kill: predict_faults.KillPoint,
) -> str | None:
    """Rank 0: merge the parts into the output; what failed, or None."""

    def after_piece(count: int) -> None:
        if kill.merge and count == 2:
            predict_faults.die()

    try:
        part_files.merge(output, directory, chunks, fmt, header=header, after_piece=after_piece)
    except OSError as err:
        return f"could not write --output {str(output)!r}: {err.strerror or err}"
    return None
