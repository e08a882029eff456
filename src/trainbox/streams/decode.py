"""A sample's members decoded by extension, and the default sample → (inputs, target) step."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

IMAGES = ("png", "jpg", "jpeg")
INPUTS = ("npy", *IMAGES)
TARGETS = ("cls", "json")


def npy(data: bytes) -> torch.Tensor:
    """A NumPy .npy array as a tensor (no pickled objects)."""
    return torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False).copy())


def image(data: bytes) -> torch.Tensor:
    """A PNG or JPEG as a float CHW tensor in [0, 1], RGB (as the image-folder task reads it)."""
    from PIL import Image  # only streams of images need it

    with Image.open(io.BytesIO(data)) as opened:
        array = np.asarray(opened.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def text(data: bytes) -> str:
    """UTF-8 text."""
    return data.decode("utf-8")


DECODERS: Mapping[str, Callable[[bytes], Any]] = {
    "npy": npy,
    "json": lambda data: json.loads(data.decode("utf-8")),
    "cls": lambda data: int(data.decode("ascii").strip()),
    "txt": text,
    "text": text,
    **{ext: image for ext in IMAGES},
}


def decoded(members: Mapping[str, bytes]) -> dict[str, Any]:
    """Each member decoded by its extension; others stay bytes."""
    out: dict[str, Any] = {}
    for ext, data in members.items():
        decoder = DECODERS.get(ext.rsplit(".", 1)[-1].lower())
        out[ext] = decoder(data) if decoder is not None else data
    return out


def pair(sample: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, target): the .npy or image member, and .cls (a class) or .json (a number list).

    KeyError names what is missing.
    """
    inputs = next((sample[ext] for ext in INPUTS if ext in sample), None)
    if inputs is None:
        raise KeyError(f"no {'/'.join(INPUTS)} member")
    if "cls" in sample:
        return inputs, torch.tensor(sample["cls"], dtype=torch.int64)
    if "json" in sample:
        return inputs, torch.tensor(sample["json"], dtype=torch.float32)
    raise KeyError(f"no {'/'.join(TARGETS)} member")
