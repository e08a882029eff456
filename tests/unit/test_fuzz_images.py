"""Fuzzed image folders and data.args for the image task: decoded items, or one clear line.

A folder the task accepts gives items of the stated crop in [0, 1] with labels that index its
classes; anything else is a UsageError (exit 2), on making the sets or on decoding an item,
whose one line has a HINT.
"""

from __future__ import annotations

import io
import math
import struct
import time
import zlib
from pathlib import Path

from hypothesis import event, example, given
from hypothesis import strategies as st
from PIL import Image

from trainbox.errors import UsageError
from trainbox.tasks import images

from fuzzing import files_under, fuzz, scratch


def encoded(width: int, height: int, mode: str, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color=7).save(buffer, format=fmt)
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header claims `width` x `height` (a decompression bomb's header)."""
    data = bytearray(encoded(1, 1, "L", "PNG"))
    # The IHDR chunk: length (8), type (12), width and height (16..24), then its CRC.
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


SIZES = st.integers(min_value=1, max_value=6)
CONTENTS = st.one_of(
    # Half the files are sound, so that many folders are accepted and every item decoded.
    st.builds(encoded, SIZES, SIZES, st.sampled_from(["L", "RGB", "RGBA"]), st.just("PNG")),
    st.builds(encoded, SIZES, SIZES, st.just("RGB"), st.just("PNG")),
    st.builds(encoded, SIZES, SIZES, st.sampled_from(["L", "RGB"]), st.just("JPEG")),
    st.builds(encoded, SIZES, SIZES, st.just("L"), st.just("JPEG")),
    st.builds(
        encoded,
        SIZES,
        SIZES,
        st.sampled_from(["L", "RGB", "RGBA", "P", "1", "I;16"]),
        st.just("PNG"),
    ),
    st.builds(encoded, SIZES, SIZES, st.sampled_from(["L", "RGB"]), st.just("JPEG")),
    st.builds(
        lambda data, cut: data[:cut],
        st.builds(encoded, SIZES, SIZES, st.just("RGB"), st.just("PNG")),
        st.integers(min_value=0, max_value=80),
    ),
    st.builds(
        png_claiming,
        st.sampled_from([0, 1, 70_000, 2**31 - 1]),
        st.sampled_from([1, 70_000, 2**31 - 1]),
    ),
    st.binary(max_size=40),
)
NAMES = st.sampled_from(["0.png", "1.PNG", "x.jpg", "y.jpeg", "z.txt", "w.png", "sub/v.png"])
CLASSES = st.sampled_from(["a", "b", "cat", "dog", "a b", ".hidden", "é", "x\ny"])
SENSIBLE_ARGS = st.fixed_dictionaries(
    {"size": st.sampled_from([4, [4, 6]])},
    optional={
        "crop": st.sampled_from([2, [2, 3]]),
        "channels": st.sampled_from([1, 3]),
        "val_fraction": st.sampled_from([0, 0.5]),
        "flip": st.booleans(),
        "seed": st.integers(min_value=0, max_value=9),
    },
)
WILD_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "size": st.sampled_from([None, 4, [4, 6], 0, -1, 2.5, "4", [4], True, [1, 2, 3]]),
        "crop": st.sampled_from([None, 2, [2, 3], 100, [0, 1], "2"]),
        "channels": st.sampled_from([1, 3, 2, "3", [1], None]),
        "val_fraction": st.sampled_from([0, 0.1, 0.5, 0.99, 1, -0.1, "x", None, math.nan]),
        "flip": st.sampled_from([True, False, "no"]),
        "seed": st.sampled_from([0, 7, "s", None]),
    },
)


@st.composite
def folders(draw: st.DrawFn) -> dict[str, bytes | None]:
    """Relative path -> file bytes (None: a directory), in one of the two layouts."""
    prefixes = draw(st.sampled_from([[""], ["train/"], ["train/", "val/"], ["val/"]]))
    tree: dict[str, bytes | None] = {}
    for prefix in prefixes:
        for name in draw(st.lists(CLASSES, min_size=1, max_size=3, unique=True)):
            tree[f"{prefix}{name}"] = None
            for file in draw(st.lists(NAMES, min_size=1, max_size=3, unique=True)):
                tree[f"{prefix}{name}/{file}"] = draw(CONTENTS)
    if draw(st.integers(min_value=0, max_value=4)) == 0:
        tree["odd/dir.png"] = None
    return tree


def build(root: Path, tree: dict[str, bytes | None]) -> None:
    root.mkdir()
    for relative, data in sorted(tree.items()):
        path = root / relative
        if data is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def assert_one_clear_line(err: UsageError) -> None:
    line = err.line()
    assert err.exit_code == 2
    assert "\n" not in line, line
    assert "HINT:" in line, line


@fuzz(150)
@given(tree=folders(), args=st.one_of(SENSIBLE_ARGS, WILD_ARGS))
# What fuzzing found: tracebacks from args of the wrong type and from a decompression bomb's
# header, and an error split over two lines by a class folder's name.
@example(tree={}, args={"val_fraction": "x"})
@example(tree={}, args={"channels": [1]})
@example(tree={}, args={"size": 2.5})
@example(tree={"a": None, "a/0.png": png_claiming(1, 2**31 - 1)}, args={})
@example(tree={"a": None, "x\ny": None}, args={})
def test_an_image_folder_gives_decoded_items_or_one_clear_line(
    tree: dict[str, bytes | None], args: dict[str, object]
) -> None:
    with scratch() as folder:
        root = folder / "images"
        build(root, tree)
        before = files_under(folder)
        start = time.monotonic()
        try:
            made = images.data(root=str(root), **args)  # type: ignore[arg-type]
            event("sets made")
            for part in (made.train, made.val):
                for index in range(len(part) if part is not None else 0):
                    pixels, label = part[index]
                    assert pixels.shape[1:] == part.crop
                    assert 0 <= float(pixels.min()) <= float(pixels.max()) <= 1
                    assert 0 <= label < len(part.classes)
            event("every item decoded")
        except UsageError as err:
            assert_one_clear_line(err)
        assert time.monotonic() - start < 5
        assert files_under(folder) == before
