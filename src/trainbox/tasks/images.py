"""A folder of PNG/JPEG files as a data source: class = subdirectory, decoded per item.

Layouts: ROOT/CLASS/*.png (the val set is a seeded fraction of each class), or
ROOT/train/CLASS/... with ROOT/val/CLASS/... Augmentation (random crop, left-right flip) draws
from a generator keyed on (seed, epoch, index) alone, so an item is the same whichever worker
decodes it, in whatever order, and after a resume.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import nn
from torch.utils.data import Dataset

from trainbox.errors import UsageError
from trainbox.tasks.problems import Problems
from trainbox.train.data.contract import Datasets

EXTENSIONS = frozenset({".png", ".jpg", ".jpeg"})
MODES = {1: "L", 3: "RGB"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Draw:
    """The random choices of one item's augmentation."""

    # Top row and left column of the crop window.
    top: int
    left: int
    # Whether the crop is mirrored left-right.
    flip: bool


def draw(
    *, seed: int, epoch: int, index: int, image: tuple[int, int], crop: tuple[int, int], flip: bool
) -> Draw:
    """The augmentation of item `index` in `epoch`: a function of its arguments only (pure).

    `image` and `crop` are (height, width). Hashing the key decorrelates neighbouring indices.
    """
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little"))
    top = rng.randrange(image[0] - crop[0] + 1)
    left = rng.randrange(image[1] - crop[1] + 1)
    return Draw(top=top, left=left, flip=flip and rng.random() < 0.5)


def centre(*, image: tuple[int, int], crop: tuple[int, int]) -> Draw:
    """The evaluation crop: the middle of the image, never flipped."""
    return Draw(top=(image[0] - crop[0]) // 2, left=(image[1] - crop[1]) // 2, flip=False)


class ImageFiles(Dataset[tuple[torch.Tensor, int]]):
    """Item i: files[i] decoded to a float CxHxW tensor in [0, 1], and its class index."""

    def __init__(
        self,
        files: tuple[str, ...],
        labels: tuple[int, ...],
        *,
        classes: tuple[str, ...],
        shape: tuple[int, int],
        size: tuple[int, int] | None,
        crop: tuple[int, int] | None,
        channels: int,
        augment: bool,
        flip: bool,
        seed: int,
    ) -> None:
        self.files, self.labels, self.classes = files, labels, classes
        # (height, width) after the resize: every image has it (checked when the set was made).
        self.shape = shape
        self.size, self.channels = size, channels
        self.crop = crop or shape
        self.augment, self.flip, self.seed = augment, flip, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.files)

    def __repr__(self) -> str:
        return f"ImageFiles(items={len(self)}, classes={len(self.classes)}, crop={self.crop})"

    def set_epoch(self, epoch: int) -> None:
        """Key the augmentation on `epoch` for plain int indices (an index's own epoch wins)."""
        self.epoch = epoch

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.files[index]
        try:
            with Image.open(path) as opened:
                image = opened.convert(MODES[self.channels])
                if self.size is not None and image.size != (self.size[1], self.size[0]):
                    image = image.resize((self.size[1], self.size[0]), Image.Resampling.BILINEAR)
                pixels = np.asarray(image, dtype=np.uint8)
        except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as err:
            # Headers were read when the set was made; the pixel data can still be truncated.
            raise UsageError(
                f"{path} cannot be decoded ({err})", hint=f"replace or remove {path}"
            ) from err
        if self.augment:
            # The epoch the trainer's sampler carries with the index
            # (train/data/map_style.EpochIndex):
            # persistent workers never see a set_epoch made in the main process.
            epoch = getattr(index, "epoch", self.epoch)
            where = draw(
                seed=self.seed, epoch=epoch, index=int(index),
                image=self.shape, crop=self.crop, flip=self.flip,
            )  # fmt: skip
        else:
            where = centre(image=self.shape, crop=self.crop)
        height, width = self.crop
        pixels = pixels[where.top : where.top + height, where.left : where.left + width]
        if where.flip:
            pixels = pixels[:, ::-1]
        # astype copies: PIL's array is read-only, and the copy is the float conversion anyway.
        tensor = torch.from_numpy(pixels.astype(np.float32)).reshape(height, width, -1)
        return tensor.permute(2, 0, 1).div_(255), self.labels[index]


def data(
    *,
    root: str,
    val_fraction: float = 0.1,
    size: int | list[int] | None = None,
    crop: int | list[int] | None = None,
    flip: bool = True,
    channels: int = 3,
    seed: int = 0,
) -> Datasets:
    """Datasets from an image folder; `size` resizes every image, `crop` is the random crop."""
    problems = Problems()
    hint = f"put images in {root}/CLASS/NAME.png (or {root}/train/CLASS and {root}/val/CLASS)"
    resize, window = _pair("size", size, problems), _pair("crop", crop, problems)
    # data.args come from YAML as written: any type may arrive where a number is meant.
    if isinstance(channels, bool) or not isinstance(channels, int) or channels not in MODES:
        problems.add(f"data.args.channels={channels!r} must be 1 or 3")
    number = not isinstance(val_fraction, bool) and isinstance(val_fraction, int | float)
    if not (number and 0 <= val_fraction < 1):
        problems.add(f"data.args.val_fraction={val_fraction!r} must be at least 0 and below 1")
    if not isinstance(flip, bool):
        problems.add(f"data.args.flip={flip!r} must be true or false")
    base = Path(root)
    if not base.is_dir():
        problems.add(f"{root} is not a directory")
    problems.raise_any(hint)
    split = (base / "train").is_dir() or (base / "val").is_dir()
    if split and not (base / "train").is_dir():
        problems.add(f"{base / 'train'} is missing (there is a val/ tree)")
    problems.raise_any(hint)
    train_tree = _tree(base / "train" if split else base, problems)
    classes = tuple(sorted(train_tree))
    val_tree = _tree(base / "val", problems) if (base / "val").is_dir() else None
    for name in sorted(set(val_tree or ()) - set(classes)):
        problems.add(f"{base / 'val' / name} is a class that {base / 'train'} does not have")
    problems.raise_any(hint)
    if val_tree is None and not split and val_fraction > 0:
        train_tree, val_tree = _split(train_tree, val_fraction, seed)
    every = [
        path for tree in (train_tree, val_tree or {}) for paths in tree.values() for path in paths
    ]
    shape = _shape(every, resize, window, problems)
    problems.raise_any(f"fix or remove the files named, or set data.args.size (in {root})")
    files = functools.partial(ImageFiles, classes=classes, shape=shape, size=resize, crop=window,
                              channels=channels, flip=flip, seed=seed)  # fmt: skip
    train = files(*_listing(train_tree, classes), augment=True)
    val = files(*_listing(val_tree, classes), augment=False) if val_tree else None
    # No max_workers: decoding costs CPU, so the pinning plan's workers are worth having.
    return Datasets(train=train, val=val)


def _pair(name: str, value: int | list[int] | None, problems: Problems) -> tuple[int, int] | None:
    """`value` as (height, width): one int is a square."""
    if value is None:
        return None
    pair = [value, value] if not isinstance(value, list | tuple) else list(value)
    if len(pair) != 2 or not all(type(v) is int and v > 0 for v in pair):
        problems.add(f"data.args.{name}={value!r} must be a positive int or [height, width]")
        return None
    return pair[0], pair[1]


def _tree(directory: Path, problems: Problems) -> dict[str, list[str]]:
    """Image paths by class (subdirectory name), sorted; a problem when there are none."""
    tree = {
        sub.name: sorted(
            str(p) for p in sub.rglob("*") if p.suffix.lower() in EXTENSIONS and p.is_file()
        )
        for sub in sorted(directory.iterdir())
        if sub.is_dir()
    }
    if not tree:
        problems.add(f"{directory} has no class subdirectories")
    for name, paths in tree.items():
        if not paths:
            problems.add(f"{directory / name} has no .png, .jpg or .jpeg files")
    return tree


def _split(
    tree: dict[str, list[str]], fraction: float, seed: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """A seeded share of each class for validation (at least one image stays in train)."""
    train, val = {}, {}
    for name, paths in tree.items():
        shuffled = list(paths)
        random.Random(f"{seed}:{name}").shuffle(shuffled)
        count = min(round(len(paths) * fraction), len(paths) - 1)
        val[name], train[name] = sorted(shuffled[:count]), sorted(shuffled[count:])
    return train, {name: paths for name, paths in val.items() if paths}


def _shape(
    paths: list[str],
    size: tuple[int, int] | None,
    crop: tuple[int, int] | None,
    problems: Problems,
) -> tuple[int, int]:
    """(height, width) every item has before its crop; reads each header, not the pixels."""
    seen: dict[tuple[int, int], str] = {}
    for path in paths:
        try:
            with Image.open(path) as image:
                width, height = image.size
        except (OSError, UnidentifiedImageError):
            problems.add(f"{path} cannot be read as an image")
            continue
        except Image.DecompressionBombError as err:
            # A header can claim billions of pixels in a few bytes; PIL refuses to decode it.
            problems.add(f"{path} cannot be read as an image ({err})")
            continue
        seen.setdefault((height, width), path)
    if size is None and len(seen) > 1:
        (one, first), (two, second) = list(seen.items())[:2]
        problems.add(
            f"images differ in size ({first} is {one[1]}x{one[0]}, {second} is {two[1]}x{two[0]})"
            " and data.args.size is not set"
        )
    shape = size or next(iter(seen), (0, 0))
    if crop is not None and (crop[0] > shape[0] or crop[1] > shape[1]):
        problems.add(f"data.args.crop={list(crop)} is larger than the images ({list(shape)})")
    return shape


def _listing(
    tree: dict[str, list[str]], names: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The tree's files, class by class, and each one's class index in `names`."""
    index = {name: i for i, name in enumerate(names)}
    pairs = [(path, index[name]) for name, paths in sorted(tree.items()) for path in paths]
    return tuple(path for path, _ in pairs), tuple(label for _, label in pairs)


def model(*, classes: int, channels: int = 3, width: int = 16) -> nn.Module:
    """A small CNN from CxHxW images (any H, W) to class logits."""
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, classes),
    )
