"""`trainbox export`: a sharded checkpoint's model as one state-dict file, in one process.

No process group and no GPU: DCP reads each tensor's pieces from every rank's file, and the
memory needed is the model's full size.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from trainbox.commands.command import Command
from trainbox.distributed import consensus
from trainbox.distributed.consensus import Problem
from trainbox.errors import StorageError, UsageError
from trainbox.infer import locate

DAMAGED_HINT = "name an older checkpoint (ls the checkpoints folder), or train again to write one"


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Check the names given, then write the model's state dict and print one line about it."""
    del env
    given, output = locate.checkpoint_path(args.checkpoint), Path(args.output)
    error = consensus.combined(problems(given, output, force=args.force))
    if error is not None:
        raise error
    print(export(resolved(given), output))
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        required=True,
        help="a sharded .dcp folder, RUN_DIR/checkpoints/latest, or a run directory (its latest)",
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        required=True,
        help="the state dict's file (torch.save), e.g. model.pt",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --output")


COMMAND = Command(
    name="export", arguments=_arguments, handler=main, overrides=False,
    help="a sharded checkpoint's model as one state-dict file, in one process",
)  # fmt: skip


def resolved(path: Path) -> Path:
    """`path`, or the checkpoint a `latest` link names (read once: it may move on)."""
    return path.parent / os.readlink(path) if path.is_symlink() else path


def problems(checkpoint: Path, output: Path, *, force: bool) -> list[Problem]:
    """Every problem with the checkpoint and the output named, before anything is read."""
    found = []
    missing = locate.checkpoint_problem(checkpoint)
    if missing is not None:
        found.append(missing)
    elif not locate.is_sharded(resolved(checkpoint)):
        found.append(
            Problem(
                text=f"--checkpoint {str(checkpoint)!r} is a one-file checkpoint, whose model is"
                " already one state dict",
                hint="read it with torch.load(PATH, weights_only=True)['model'], or name a"
                " sharded step-XXXXXXXX.dcp folder (train.strategy=fsdp)",
            )
        )
    if output.is_dir():
        # Not the predictions file eval and predict's hint would suggest.
        wrong = Problem(
            text=f"--output {str(output)!r} is a directory",
            hint=f"name a file, e.g. --output {output / 'model.pt'}",
        )
        return [*found, wrong]
    return found + locate.destination_problems(output, force=force)


def export(checkpoint: Path, output: Path) -> str:
    """Check the shards' digests, write the model to `output` atomically; the line to print."""
    import torch  # here, not at the top: the other commands start without torch

    from trainbox.atomic import write_with
    from trainbox.checkpoint import shards
    from trainbox.train.resume.state import tensors_sha256

    reason = shards.check_alone(checkpoint)
    if reason is not None:
        raise UsageError(f"--checkpoint {str(checkpoint)!r} cannot be used: {reason}",
                         hint=DAMAGED_HINT)  # fmt: skip
    try:
        step = shards.read_record(checkpoint)["step"]
        tensors = shards.whole_model(checkpoint)
    except ValueError as err:
        raise UsageError(f"--checkpoint {str(checkpoint)!r}: {err}", hint=DAMAGED_HINT) from err
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_with(output, lambda handle: torch.save(tensors, handle))
    except OSError as err:
        raise StorageError(
            f"could not write --output {str(output)!r}: {err.strerror or err}",
            hint="free space there or choose another --output; the checkpoint is untouched",
        ) from err
    size = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    return (
        f"exported the model of step {step} ({len(tensors)} tensors, {size / 1e6:.1f} MB) to"
        f" {output}: params_sha256={tensors_sha256(tensors)}"
    )
