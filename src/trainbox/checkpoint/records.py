"""torch.save's zip format, written without its per-record CRC32s: the sha256 sidecar covers them.

torch.load never checks those CRC32s, and computing them is all of serialising's own CPU time
(`benchmarks/record_crc.py`). torch's own switch (`set_crc32_options`) is process-wide and would
reach any torch.save running on another thread meanwhile, so this file's zip writer is made with
the flag instead, through private torch names. A unit test fails on a torch that moved them;
such a torch gets plain torch.save here, and a warning in the log.
"""

from __future__ import annotations

import functools
import pickle
from typing import IO, Any, cast

import torch
import torch.serialization

from trainbox.checkpoint.hashing import WritableFile
from trainbox.logs import log

# The private names torch.save itself calls (torch/serialization.py), or None where missing.
# Worth it only while it beats torch.save: benchmarks/record_crc.py measures it, and
# benchmarks/README.md keeps the figures.
FILE_WRITER = getattr(torch._C, "PyTorchFileWriter", None)
SAVE_RECORDS = getattr(torch.serialization, "_save", None)
STORAGE_ALIGNMENT = getattr(torch.serialization, "_get_storage_alignment", None)


def write(payload: Any, file: WritableFile) -> None:
    """What torch.save(payload, file) writes, with every record's CRC32 left at 0."""
    # torch's stubs ask for a file; it only ever calls write and flush.
    target = cast(IO[bytes], file)
    if FILE_WRITER is None or SAVE_RECORDS is None or STORAGE_ALIGNMENT is None:
        _warn_public_path()
        torch.save(payload, target)
        return
    zip_writer = FILE_WRITER(target, False, STORAGE_ALIGNMENT())
    try:
        # The arguments torch.save passes by default.
        SAVE_RECORDS(payload, zip_writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    finally:
        # Even after a failure, as torch.save does: left unfinished, the writer finishes in its
        # destructor, where an exception from `file` aborts the process.
        zip_writer.write_end_of_file()
    file.flush()


@functools.cache
def _warn_public_path() -> None:
    """Once per process: this torch lacks the private names, checkpoints take torch.save."""
    log.warning(
        "checkpoints are written with torch.save (record CRC32s computed, slower): this torch"
        " lacks the private names trainbox/checkpoint/records.py uses",
        torch=torch.__version__,
    )
