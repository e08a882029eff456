"""The files a run leaves in run_dir besides checkpoints: config.yaml and run.json (the
manifest), metrics.jsonl and summary.json. Rank 0 writes them, each atomically."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import torch

from trainbox import atomic, provenance, sinks
from trainbox.config import Config, fingerprint, to_yaml
from trainbox.launch.context import LaunchContext
from trainbox.provenance import Provenance
from trainbox.sinks import Sink, SinkRunner
from trainbox.train import seeding
from trainbox.version import __version__

SUMMARY = "summary.json"


def write_json(path: Path, data: Any) -> None:
    """Write JSON through a temp file and rename, so a reader never sees half a file.

    A value that is not finite (a NaN loss) is written as null: strict JSON has no NaN.
    """
    write_text(path, json.dumps(finite(data), indent=2, default=str, allow_nan=False) + "\n")


def finite(data: Any) -> Any:
    """`data` with every NaN or infinite float replaced by None, in nested dicts and lists."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: finite(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [finite(value) for value in data]
    return data


def write_text(path: Path, text: str) -> None:
    """Atomic and durable text write."""
    atomic.write_text(path, text)


def params_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer in name order: the reproducibility fingerprint."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        # Raw bytes in row-major order; viewing as uint8 first also covers bf16, which NumPy lacks.
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest.update(flat.numpy().tobytes())
    return digest.hexdigest()


class MetricsFile:
    """metrics.jsonl: one JSON object per line, appended and flushed as training goes; every
    record also goes to the run's metrics sinks (trainbox.sinks), off the training thread."""

    def __init__(self, path: Path, *, enabled: bool, sinks: Sequence[Sink] = ()) -> None:
        self.path = path
        self.enabled = enabled
        self.sinks = SinkRunner(sinks if enabled else ())

    @classmethod
    def for_run(cls, config: Config, *, enabled: bool) -> MetricsFile:
        """RUN_DIR/metrics.jsonl with the sinks `logging` asks for (made on rank 0 only)."""
        run_dir, wanted = config.output_dir, config.logging
        # Every rank checks, so a missing package stops them all at once, not rank 0 alone.
        sinks.check(tensorboard=wanted.tensorboard, factories=wanted.sinks)
        made = (
            sinks.build(run_dir=run_dir, tensorboard=wanted.tensorboard, factories=wanted.sinks)
            if enabled
            else []
        )
        return cls(run_dir / "metrics.jsonl", enabled=enabled, sinks=made)

    def close(self) -> None:
        """Let the sinks take the queued records and close them."""
        self.sinks.close()

    def keep_until(self, step: int, *, redo_eval: bool = False) -> None:
        """Drop lines past `step`: after a resume they describe work that was thrown away.

        `redo_eval`: also drop the evaluation at `step`, which the run is about to redo.
        """
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the half line a killed process left
            at = record.get("step", 0)
            if at < step or (at == step and not (redo_eval and record.get("kind") == "val")):
                kept.append(line)
        write_text(self.path, "".join(f"{line}\n" for line in kept))

    def last_loss(self) -> float | None:
        """The loss of the last train line, or None (rank 0 only; others have no file)."""
        if not self.enabled or not self.path.exists():
            return None
        loss = None
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("kind") == "train" and "loss" in record:
                loss = record["loss"]
        return loss

    def append(self, record: dict[str, Any]) -> None:
        """Add one record (rank 0 only)."""
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        self.sinks.put(record)


def write_manifest(
    run_dir: Path,
    config: Config,
    *,
    context: LaunchContext,
    device: torch.device,
    user_code: Mapping[str, str],
    resumed_from: str | None,
    initialised_from: str | None,
) -> None:
    """config.yaml (what to rerun) and run.json (what it ran on, and where it started from)."""
    write_text(run_dir / "config.yaml", to_yaml(config))
    record = {
        **environment(),
        "launch": context.describe(),
        "device": str(device),
        "backend": torch.distributed.get_backend(),
        "config_hash": fingerprint(config),
        "seed": config.seed,
        "rank_seeds": [seeding.rank_seed(config.seed, rank) for rank in range(context.world_size)],
        "resumed_from": resumed_from,
        "initialised_from": initialised_from,
        "user_code": dict(user_code),
        "started": time.time(),
    }
    write_json(run_dir / "run.json", record)


def environment() -> dict[str, Any]:
    """The software and machine behind a run's numbers (throughput depends on them)."""
    return {
        "trainbox": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "image": image_record(os.environ, provenance.read()),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "host": {
            "name": platform.node(),
            "cpus_logical": psutil.cpu_count(logical=True),
            "cpus_physical": psutil.cpu_count(logical=False),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        },
    }


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    """summary.json: written last, so its presence says the run finished."""
    write_json(run_dir / SUMMARY, summary)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """A finished run's summary.json, or None (absent, unreadable, not an object)."""
    try:
        data = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    return ".".join(map(str, torch.cuda.nccl.version()))


def image_record(env: Mapping[str, str], image: Provenance) -> dict[str, str | None]:
    """The image's build labels (the Dockerfile's TRAINBOX_IMAGE_* variables) and lock hash."""
    labels: dict[str, str | None] = {
        key.removeprefix("TRAINBOX_IMAGE_").lower(): value
        for key, value in env.items()
        if key.startswith("TRAINBOX_IMAGE_")
    }
    # The provenance file is the image's own word: it holds when a launcher drops the variables.
    if image.revision is not None:
        labels.setdefault("revision", image.revision)
    return {**labels, "lock_sha256": image.lock_sha256}
