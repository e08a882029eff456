"""A sample's members decoded by extension, and the default sample → (inputs, target) step."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Mapping
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
        # An RGB image as it is: convert would only copy it.
        rgb = opened if opened.mode == "RGB" else opened.convert("RGB")
        pixels = np.asarray(rgb)
    # One pass to float CHW and one in-place divide (the same float32 division as before): a
    # float HWC array, a divided copy and a CHW copy can cost more than decoding the JPEG.
    array = np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=np.float32)
    np.divide(array, 255.0, out=array)
    return torch.from_numpy(array)


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


# What a layout the default pair cannot read needs: the same fault would stop every sample laid
# out that way, so skipping them (data.args.on_corrupt=skip) is no way out.
LAYOUT_HINT = (
    "every sample laid out like this fails the same way: set data.args.decode=module:function"
    " to a function that takes a sample's decoded members ({ext: value}) and returns its"
    " (inputs, target), or write the shards with one .npy or image member and one .cls or"
    " .json member per sample (python -m trainbox.tasks.to_shards)"
)


class LayoutError(ValueError):
    """A sample whose member names the default pair cannot map to (inputs, target)."""


def last_extension(ext: str) -> str:
    """What a member decodes as: "input.npy" (KEY.input.npy) as "npy", lower case."""
    return ext.rsplit(".", 1)[-1].lower()


def decoded(members: Mapping[str, bytes]) -> dict[str, Any]:
    """Each member decoded by its last extension; others stay bytes."""
    out: dict[str, Any] = {}
    for ext, data in members.items():
        decoder = DECODERS.get(last_extension(ext))
        out[ext] = decoder(data) if decoder is not None else data
    return out


def pair(sample: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, target): the member ending .npy or in an image extension, and the one ending
    .cls (a class) or .json (a number list); LayoutError lists the members when one is not
    there or two would do."""
    # Each member's last extension, worked out once: pair runs for every sample.
    named: dict[str, list[str]] = {}
    for name in sample:
        named.setdefault(last_extension(name), []).append(name)
    inputs = sample[_member(sample, named, INPUTS)]
    target = _member(sample, named, TARGETS)
    if last_extension(target) == "cls":
        return inputs, torch.tensor(sample[target], dtype=torch.int64)
    return inputs, torch.tensor(sample[target], dtype=torch.float32)


def _member(
    sample: Mapping[str, Any], named: Mapping[str, list[str]], wanted: tuple[str, ...]
) -> str:
    """The one member whose last extension (`named`: the members by it) comes first in
    `wanted`."""
    for ext in wanted:
        found = sorted(named.get(ext, ()))
        if len(found) > 1:
            raise LayoutError(
                f"members {_listed(found)} each end in .{ext}, so pair cannot tell which to"
                f" use: {_advice(sample)}"
            )
        if found:
            return found[0]
    raise LayoutError(f"no {'/'.join(wanted)} member: {_advice(sample)}")


def _listed(names: Iterable[str]) -> str:
    return ", ".join(f".{name}" for name in names)


def _advice(sample: Mapping[str, Any]) -> str:
    return (
        f"the sample's members are {_listed(sample)}; data.args.decode=module:function reads"
        " other layouts"
    )
