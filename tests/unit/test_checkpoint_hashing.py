"""HashingWriter: what lands in the file is what is hashed, whichever memory torch writes from."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import torch

from trainbox.checkpoint.hashing import HashingWriter, PayloadMemory


def _buffer_of(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as torch.save hands them to write: a view of its memory."""
    return memoryview(tensor.numpy()).cast("B")


def test_payload_memory_finds_a_buffer_inside_a_payload_tensor() -> None:
    weight = torch.arange(16.0)
    memory = PayloadMemory({"model": {"w": weight}})
    inner = _buffer_of(weight)[8:24]
    owned = memory.view(inner)
    assert owned is not None
    assert bytes(owned) == bytes(inner)
    assert np.frombuffer(owned, np.uint8).ctypes.data == np.frombuffer(inner, np.uint8).ctypes.data


def test_payload_memory_refuses_memory_the_payload_does_not_own() -> None:
    memory = PayloadMemory({"model": {"w": torch.arange(16.0)}})
    assert memory.view(_buffer_of(torch.arange(16.0))) is None
    assert memory.view(memoryview(b"header")) is None


def test_the_digest_covers_owned_foreign_and_small_writes_in_order() -> None:
    owned, foreign = torch.randn(1 << 19), torch.randn(1 << 19)  # 2 MB each
    sink = io.BytesIO()
    with HashingWriter(sink, lambda: None, payload={"w": owned}) as writer:
        for data in (b"head", _buffer_of(owned), b"mid", _buffer_of(foreign), b"tail"):
            writer.write(data)
        digest = writer.hexdigest()
    assert digest == hashlib.sha256(sink.getvalue()).hexdigest()
    assert len(sink.getvalue()) == 4 + 3 + 4 + 2 * (1 << 21)


def test_the_first_bytes_are_announced_once() -> None:
    announced: list[int] = []
    with HashingWriter(io.BytesIO(), lambda: announced.append(1)) as writer:
        writer.write(b"a")
        writer.write(b"b")
    assert announced == [1]
