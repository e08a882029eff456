"""torch.save's zip format, written without its per-record CRC32s: the sha256 sidecar covers them.

torch.load never checks those CRC32s, and computing them cost a third of torch.save's time.
torch's own switch (`set_crc32_options`) is process-wide and would reach any torch.save running
on another thread meanwhile, so this file's zip writer is made with the flag instead.
"""

from __future__ import annotations

import pickle
from typing import IO, Any, cast

import torch
import torch.serialization

from trainbox.checkpoint.hashing import Sink


def write(payload: Any, file: Sink) -> None:
    """What torch.save(payload, file) writes, with every record's CRC32 left at 0."""
    # torch's stubs ask for a file; it only ever calls write and flush.
    target = cast(IO[bytes], file)
    save_records = getattr(torch.serialization, "_save", None)
    alignment = getattr(torch.serialization, "_get_storage_alignment", None)
    if save_records is None or alignment is None:
        # A torch that moved these: the same format, CRC32s computed (a unit test notices).
        torch.save(payload, target)
        return
    zip_writer = torch._C.PyTorchFileWriter(target, False, alignment())
    try:
        # The arguments torch.save passes by default.
        save_records(payload, zip_writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    finally:
        # Even after a failure, as torch.save does: left unfinished, the writer finishes in its
        # destructor, where an exception from `file` aborts the process.
        zip_writer.write_end_of_file()
    file.flush()
