"""Where eval and predict read and write: the checkpoint, the run's config, the output file.

No torch here: the CLI needs these answers before it pins CPUs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from trainbox.config import Config, load, parse_yaml
from trainbox.config.factories import API_SUPPLIED
from trainbox.distributed.consensus import Problem
from trainbox.errors import UsageError
from trainbox.storage import reading

# A run keeps its resolved config here, beside `checkpoints/`.
RUN_CONFIG = "config.yaml"
# Preflight checks about run_dir: eval and predict never write there.
CHECKPOINT_HINT = (
    "name a checkpoint (RUN_DIR/checkpoints/step-XXXXXXXX.pt or .dcp, or"
    " RUN_DIR/checkpoints/latest) or a run directory"
)
# What every complete sharded checkpoint folder holds (checkpoint/shards.py, which needs torch).
SHARDED_MANIFEST = "manifest.json"
RUN_DIR_CHECKS = frozenset({"run_dir", "disk_space"})
# Output formats by file extension (predict).
FORMATS = {".csv": "csv", ".jsonl": "jsonl"}
FORCE_HINT = "pass --force to replace it, or choose another --output"


def checkpoint_path(given: str) -> Path:
    """The checkpoint `--checkpoint` names; a run directory or its checkpoints/ means `latest`.

    An s3:// URL is fetched into the node's working copy first (storage/reading.py).
    """
    path = Path(reading.localise(given, os.environ, what="--checkpoint"))
    if path.is_dir():
        for candidate in (path / "checkpoints" / "latest", path / "latest"):
            # A link whose file is gone is still the one meant: checkpoint_problem says so.
            if candidate.is_symlink() or candidate.exists():
                return candidate
    return path


def checkpoint_problem(path: Path) -> Problem | None:
    """A --checkpoint that names no file (a `latest` link is followed once)."""
    if path.is_symlink():
        link = os.readlink(path)
        target = path.parent / link
        if not target.exists():
            return Problem(
                text=f"--checkpoint {str(path)!r} links to {link}, which does not exist (deleted?)",
                hint=f"name a checkpoint that exists (ls {path.parent}), or train again to write"
                " a new one",
            )
    else:
        target = path
    if target.is_file():
        return None
    if is_sharded(target):
        return None
    missing = "is a directory without checkpoints/latest" if target.is_dir() else "does not exist"
    return Problem(text=f"--checkpoint {str(path)!r} {missing}", hint=CHECKPOINT_HINT)


def is_sharded(path: Path) -> bool:
    """Whether `path` is a complete sharded checkpoint folder (train.strategy=fsdp)."""
    return path.is_dir() and (path / SHARDED_MANIFEST).is_file()


def early_problems(checkpoint: Path, output: Path | None, *, predict: bool) -> list[Problem]:
    """What is wrong with the files named, found on any rank before a process group is joined.

    The output's destination is checked by rank 0 alone: others may not share its file system.
    """
    problems = [p for p in (checkpoint_problem(checkpoint),) if p is not None]
    if output is not None and output.is_dir():
        problems.append(directory_problem(output))
    elif predict and output is not None and (wrong := format_problem(output)) is not None:
        problems.append(wrong)
    return problems


def directory_problem(path: Path) -> Problem:
    """An --output that is a directory: --force would not help, a file inside it would."""
    return Problem(
        text=f"--output {str(path)!r} is a directory",
        hint=f"name a file, e.g. --output {path / 'predictions.csv'}",
    )


def run_config(checkpoint: Path) -> Path | None:
    """The config.yaml of the run that wrote `checkpoint` (RUN/checkpoints/...), if there is one."""
    if checkpoint.parent.name != "checkpoints":
        return None
    candidate = checkpoint.parent.parent / RUN_CONFIG
    return candidate if candidate.is_file() else None


def settings(
    checkpoint: Path, config_file: str | None, overrides: Sequence[str]
) -> tuple[Config, str | None]:
    """The config to evaluate with, and where it came from (None: the defaults).

    Without --config the run's own config.yaml is used, so a checkpoint of a run with overrides
    needs no repeating of them.
    """
    found = run_config(checkpoint)
    source = config_file or (str(found) if found else None)
    if source is not None:
        unbuildable = api_supplied(_read_yaml(Path(source)), overrides)
        if unbuildable:
            marked = ", ".join(f"{key}: {API_SUPPLIED}" for key in unbuildable)
            raise UsageError(
                f"{source} is of a run trained through the Python API ({marked}): no factory"
                " rebuilds its model and data",
                hint="name factories that build the same model and data, e.g. `trainbox eval"
                " --checkpoint RUN model.factory=pkg.module:function"
                " data.factory=pkg.module:function` (or --config FILE), or evaluate through the"
                " Python API",
            )
    loaded = load(source, overrides)
    fatal = [name for name in loaded.preflight.fatal if name not in RUN_DIR_CHECKS]
    preflight = dataclasses.replace(loaded.preflight, fatal=fatal)
    return dataclasses.replace(loaded, preflight=preflight), source


def api_supplied(data: object, overrides: Sequence[str]) -> list[str]:
    """The factory keys a run's config marks as objects the Python API passed, unless overridden."""
    overridden = {item.partition("=")[0].strip() for item in overrides}
    found = []
    for section in ("model", "data"):
        part = data.get(section) if isinstance(data, dict) else None
        key = f"{section}.factory"
        if isinstance(part, dict) and part.get("factory") == API_SUPPLIED and key not in overridden:
            found.append(key)
    return found


def _read_yaml(path: Path) -> object:
    """The file's YAML, or None when it cannot be read: config.load then says why, in full."""
    # Read within the config's limits: a deep or alias-bombed file must reach config.load.
    try:
        return parse_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def output_format(path: Path) -> str | None:
    """`csv` or `jsonl` by the extension of `path`; None for any other."""
    return FORMATS.get(path.suffix.lower())


def format_problem(path: Path) -> Problem | None:
    """A predict output whose extension names no format we write."""
    if output_format(path) is not None:
        return None
    return Problem(
        text=f"--output {str(path)!r} has extension {path.suffix or '(none)'!r}; predict writes"
        f" {' or '.join(FORMATS)}",
        hint="name the output file predictions.csv or predictions.jsonl",
    )


def destination_problems(path: Path, *, force: bool) -> list[Problem]:
    """Why `path` cannot take the output: it exists (without --force), or cannot be written."""
    if path.is_dir():
        return [directory_problem(path)]
    if path.exists() and not force:
        return [Problem(text=f"--output {str(path)!r} already exists", hint=FORCE_HINT)]
    existing = path.absolute().parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [
            Problem(
                text=f"--output {str(path)!r} cannot be written ({existing} is not a writable"
                " directory)",
                hint="choose an --output in a writable directory",
            )
        ]
    return []
