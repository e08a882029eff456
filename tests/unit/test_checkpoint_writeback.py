"""Writeback: a checkpoint's bytes are handed to the disk as they are written, not at fsync."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from trainbox.checkpoint import files as checkpoint
from trainbox.checkpoint import writeback
from trainbox.checkpoint.writeback import Writeback

MB = 1 << 20


def advice_recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """The (offset, length, advice) of every posix_fadvise call from now on."""
    calls: list[tuple[int, int, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    return calls


def test_each_chunk_is_handed_to_the_disk_once_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = advice_recorded(monkeypatch)
    pieces = [b"h" * 100, os.urandom(3 * MB), b"m" * 10, os.urandom(2 * MB), b"t" * 7]
    with (tmp_path / "f").open("wb") as handle:
        file = Writeback(handle, every=MB)
        for piece in pieces:
            assert file.write(piece) == len(piece)
        file.flush()
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)
    # Each call covers the chunk just written and the one before it, never beyond the end.
    ends = [100 + 3 * MB, 100 + 3 * MB + 10 + 2 * MB]
    assert calls == [
        (0, ends[0], os.POSIX_FADV_DONTNEED),
        (0, ends[1], os.POSIX_FADV_DONTNEED),
    ]


def test_the_clean_chunks_before_the_last_two_are_not_asked_about_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = advice_recorded(monkeypatch)
    with (tmp_path / "f").open("wb") as handle:
        file = Writeback(handle, every=MB)
        for _ in range(4):
            file.write(bytes(MB))
    assert [(offset, length) for offset, length, _ in calls] == [
        (0, MB),
        (0, 2 * MB),
        (MB, 2 * MB),
        (2 * MB, 2 * MB),
    ]


def test_refused_advice_does_not_fail_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: int) -> None:
        raise OSError(errno.ESPIPE, os.strerror(errno.ESPIPE))

    monkeypatch.setattr(os, "posix_fadvise", refuse)
    with (tmp_path / "f").open("wb") as handle:
        Writeback(handle, every=MB).write(bytes(2 * MB))
    assert (tmp_path / "f").stat().st_size == 2 * MB


def test_a_checkpoint_save_hands_its_bytes_to_the_disk_as_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writeback, "WRITEBACK_BYTES", MB)
    calls = advice_recorded(monkeypatch)
    weights = {"a": torch.randn(MB), "b": torch.randn(MB)}  # two 4 MB records
    path = checkpoint.save(tmp_path, 1, {"step": 1, "model": weights})
    assert len(calls) >= 2
    assert max(offset + length for offset, length, _ in calls) <= path.stat().st_size
    assert torch.equal(checkpoint.load(path)["model"]["b"], weights["b"])
