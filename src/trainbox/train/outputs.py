"""The files a run leaves in run_dir, written by rank 0 only, each atomically."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch

from trainbox import atomic


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
    """metrics.jsonl: one JSON object per line, appended and flushed as training goes."""

    def __init__(self, path: Path, *, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

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
