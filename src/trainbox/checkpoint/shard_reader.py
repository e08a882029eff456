"""DCP's reader of a sharded checkpoint, and one that fetches from an object store what it reads.

Apart from checkpoint/shards.py so that DCP (and the fsdp it imports) loads only when a sharded
checkpoint is read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp

from trainbox.storage.mirror import SOURCE, Mirror
from trainbox.storage.store import Entry


def reader(path: Path, *, manifest: str) -> dcp.FileSystemReader:
    """DCP's reader of the checkpoint at `path`; of a copy fetched in part from an object store
    (it holds mirror.SOURCE), one that fetches each file the first time DCP reads it, at the size
    and SHA-256 the folder's `manifest` lists."""
    note = path / SOURCE
    if note.is_file():
        return _FetchingReader(path, note.read_text().strip(), path / manifest)
    return dcp.FileSystemReader(path)


class _FetchingReader(dcp.FileSystemReader):
    """A FileSystemReader whose files not yet here are fetched from the store as they are read.

    A rank fetched its own shards at the start; what else it reads (a replicated entry saved
    by another rank, or everything when resharding to another world size) comes on demand,
    so each rank downloads what it reads and nothing more.
    """

    def __init__(self, path: Path, source: str, manifest: Path) -> None:
        super().__init__(path)
        self._folder = Path(path)
        # Every file's size and SHA-256, which the store's copies must match.
        self._manifest = manifest
        mirror = Mirror.for_url(source, os.environ)
        if mirror is None:
            raise ValueError(f"{path}/{SOURCE} names no s3:// URL ({source!r})")
        # Files land in this folder, whatever working copy the URL would otherwise get.
        self._mirror = Mirror(mirror.location, self._folder, mirror.store)
        self._files: dict[int | object, str] = {}

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:  # fmt: skip
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        # Metadata.storage_data maps every saved piece to the file holding it.
        self._files = {index: info.relative_path for index, info in metadata.storage_data.items()}

    def read_data(self, plan: Any, planner: Any) -> Any:
        needed = sorted({self._files[item.storage_index] for item in plan.items})
        listed = json.loads(self._manifest.read_text())["files"]
        self._mirror.fetch(
            {
                name: Entry(size=int(listed[name]["bytes"]), etag=str(listed[name]["sha256"]))
                for name in needed
            }
        )
        return super().read_data(plan, planner)
