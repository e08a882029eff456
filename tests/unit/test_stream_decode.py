"""The default decoder reads WebDataset's member names: a member counts by its last extension
(KEY.input.npy as .npy), two members with the same one are refused by name, and a sample it
cannot pair lists its members and points to data.args.decode instead of skipping."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainbox.errors import UsageError
from trainbox.streams import decode
from trainbox.streams.dataset import ShardStream
from trainbox.streams.shards import read_manifest, write_shards
from trainbox.tasks import shards as shard_task

from stream_shards import npy, webdataset


def png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), 255, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def pair_of(members: dict[str, bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    return decode.pair(decode.decoded(members))


ARRAY = npy(np.array([1.0, 2.0], np.float32))


@pytest.mark.parametrize(
    ("members", "shape", "target"),
    [
        ({"npy": ARRAY, "cls": b"2"}, (2,), 2),
        ({"input.npy": ARRAY, "label.cls": b"2"}, (2,), 2),
        ({"image.png": png(), "label.cls": b"1"}, (3, 4, 5), 1),
        ({"x.y.npy": ARRAY, "cls": b"0"}, (2,), 0),
        ({"input.NPY": ARRAY, "label.CLS": b"2"}, (2,), 2),
        ({"input.npy": ARRAY, "target.json": b"[0.5]"}, (2,), [0.5]),
        ({"input.npy": ARRAY, "label.cls": b"1", "meta.txt": b"a", "meta.json": b"{}"}, (2,), 1),
    ],
)
def test_pair_takes_each_member_by_its_last_extension(
    members: dict[str, bytes], shape: tuple[int, ...], target: object
) -> None:
    inputs, got = pair_of(members)
    assert tuple(inputs.shape) == shape
    assert got.tolist() == target


def test_pair_prefers_a_cls_target_to_json_and_npy_inputs_to_an_image() -> None:
    members = {"image.png": png(), "input.npy": ARRAY, "meta.json": b"[9]", "label.cls": b"1"}
    inputs, target = pair_of(members)
    assert (tuple(inputs.shape), target.tolist()) == ((2,), 1)


@pytest.mark.parametrize(
    ("members", "named"),
    [
        ({"input.npy": ARRAY, "mask.npy": ARRAY, "cls": b"1"}, (".input.npy", ".mask.npy")),
        ({"npy": ARRAY, "input.npy": ARRAY, "cls": b"1"}, (".npy", ".input.npy")),
        ({"npy": ARRAY, "label.cls": b"1", "class.cls": b"2"}, (".class.cls", ".label.cls")),
    ],
)
def test_two_members_with_the_last_extension_pair_would_use_are_refused_by_name(
    members: dict[str, bytes], named: tuple[str, str]
) -> None:
    with pytest.raises(decode.LayoutError) as caught:
        pair_of(members)
    text = str(caught.value)
    assert all(name in text for name in named)
    assert "data.args.decode" in text


@pytest.mark.parametrize(
    ("members", "missing"),
    [
        ({"input.bin": b"\x00", "label.cls": b"1"}, "no npy/png/jpg/jpeg member"),
        ({"input.npy": ARRAY, "label.txt": b"1"}, "no cls/json member"),
    ],
)
def test_a_sample_pair_cannot_read_lists_its_members_and_points_to_a_decode_function(
    members: dict[str, bytes], missing: str
) -> None:
    with pytest.raises(decode.LayoutError) as caught:
        pair_of(members)
    text = str(caught.value)
    assert missing in text
    assert all(f".{ext}" in text for ext in members)
    assert "data.args.decode" in text
    assert "on_corrupt" not in text


def test_a_stream_of_webdataset_names_reads_with_the_default_decoder(tmp_path: Path) -> None:
    manifest = write_shards(tmp_path, webdataset(0, 5), per_shard=2)
    data = shard_task.data(train=str(manifest)).train
    assert [(data[i][0].tolist(), int(data[i][1])) for i in range(5)] == [
        ([i, i], i % 3) for i in range(5)
    ]


def layout_line(tmp_path: Path) -> str:
    """The line a stream of samples the default decoder cannot pair stops with."""
    samples = [(f"{i:04d}", {"input.bin": b"\x00", "label.cls": b"1"}) for i in range(3)]
    data = ShardStream(read_manifest(write_shards(tmp_path, samples, per_shard=3), key="k"))
    with pytest.raises(UsageError) as caught:
        data[1]
    return caught.value.line()


def test_a_layout_the_default_decoder_cannot_read_names_the_sample_and_its_members(
    tmp_path: Path,
) -> None:
    line = layout_line(tmp_path)
    assert "shard-000000.tar sample 1 (0001)" in line
    assert ".input.bin, .label.cls" in line
    assert "data.args.decode" in line


def test_a_layout_problem_does_not_suggest_skipping_every_sample(tmp_path: Path) -> None:
    line = layout_line(tmp_path)
    assert "on_corrupt=skip" not in line
    assert f"HINT: {decode.LAYOUT_HINT}" in line


@pytest.mark.parametrize(("name", "mode"), [("a.png", "RGB"), ("b.jpg", "RGB"), ("c.png", "L")])
def test_an_image_decodes_to_the_image_folders_tensor_bit_for_bit(
    tmp_path: Path, name: str, mode: str
) -> None:
    from trainbox.tasks import images

    pixels = np.random.default_rng(0).integers(0, 256, (7, 9, 3), dtype=np.uint8)
    path = tmp_path / "cls" / name
    path.parent.mkdir()
    Image.fromarray(pixels).convert(mode).save(path)
    folder = images.data(root=str(tmp_path), val_fraction=0, flip=False).train
    decoded = decode.image(path.read_bytes())
    assert decoded.is_contiguous()
    assert torch.equal(decoded, folder[0][0])
