"""Tar shards: written and read back by key, decoded by extension, the manifest's checks, a
truncated or corrupt shard named with its sample, the converter and the data factory."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainbox.errors import UsageError
from trainbox.streams import decode, plan
from trainbox.streams.dataset import PlannedReader, ReadFailure, ShardStream, StreamBatch
from trainbox.streams.shards import (
    Cursor,
    ShardFault,
    key_and_ext,
    missing_or_short,
    read_manifest,
    write_shards,
)
from trainbox.tasks import shards as shard_task
from trainbox.tasks import to_shards

from stream_shards import npy, numbered


def stream(tmp_path: Path, count: int = 7, per_shard: int = 3, **options: object) -> ShardStream:
    manifest = write_shards(tmp_path / "set", numbered(count), per_shard=per_shard)
    return ShardStream(read_manifest(manifest, key="data.args.train"), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "key", "ext"),
    [("a.cls", "a", "cls"), ("d/x.seg.png", "d/x", "seg.png"), ("noext", "noext", "")],
)
def test_a_member_name_splits_into_key_and_extension_at_the_first_dot(
    name: str, key: str, ext: str
) -> None:
    assert key_and_ext(name) == (key, ext)


def test_shards_hold_their_samples_by_key_and_the_manifest_counts_them(tmp_path: Path) -> None:
    data = stream(tmp_path)
    assert data.manifest.counts == [3, 3, 1]
    assert len(data) == 7
    for i in range(7):
        inputs, target = data[i]
        assert inputs.tolist() == [i, i]
        assert int(target) == i % 3


def test_the_manifest_is_found_from_its_folder(tmp_path: Path) -> None:
    write_shards(tmp_path / "set", numbered(2), per_shard=5)
    assert read_manifest(tmp_path / "set", key="k").counts == [2]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read"),
        ("{}", "is not a trainbox-shards/1 manifest"),
        ('{"format": "trainbox-shards/1", "shards": []}', "lists no shards"),
        ('{"format": "trainbox-shards/1", "shards": [{"path": "a.tar"}]}', "shard 0 is"),
    ],
)
def test_a_bad_manifest_is_one_line_naming_it(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "manifest.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as caught:
        read_manifest(path, key="data.args.train")
    assert says in caught.value.line()
    assert "data.args.train" in caught.value.line()
    assert "HINT:" in caught.value.line()


def test_a_missing_or_truncated_shard_is_seen_by_its_size(tmp_path: Path) -> None:
    data = stream(tmp_path)
    first, second = data.manifest.shards[:2]
    Path(first.location).write_bytes(Path(first.location).read_bytes()[:700])
    Path(second.location).unlink()
    found = missing_or_short(data.manifest.shards)
    assert found == [
        f"shard {first.location} is 700 bytes, not the {first.size} written",
        f"shard {second.location} cannot be read (FileNotFoundError)",
    ]


def test_reading_a_truncated_shard_names_the_shard_and_the_sample(tmp_path: Path) -> None:
    data = stream(tmp_path)
    shard = data.manifest.shards[0]
    Path(shard.location).write_bytes(Path(shard.location).read_bytes()[:1800])
    with pytest.raises(ShardFault) as caught:
        Cursor().read(shard, 0)
    assert caught.value.line.startswith(f"shard {shard.location} sample 0: ")


def test_a_cursor_starts_the_shard_again_after_a_fault(tmp_path: Path) -> None:
    data = stream(tmp_path)
    shard = data.manifest.shards[0]
    whole = Path(shard.location).read_bytes()
    Path(shard.location).write_bytes(whole[:5000])  # samples 0 and 1 whole, sample 2 cut
    cursor = Cursor()
    with pytest.raises(ShardFault):
        cursor.read(shard, 2)
    assert cursor.read(shard, 1)[0] == "s0001"


def test_a_sample_that_does_not_decode_is_named_with_its_key(tmp_path: Path) -> None:
    manifest = write_shards(tmp_path, [("only", {"cls": b"1"})], per_shard=4)
    data = ShardStream(read_manifest(manifest, key="k"))
    with pytest.raises(UsageError) as caught:
        data[0]
    line = caught.value.line()
    assert "shard-000000.tar sample 0 (only)" in line
    assert "no npy/png/jpg/jpeg member" in line


@pytest.mark.parametrize(
    ("ext", "data", "value"),
    [
        ("cls", b" 4\n", 4),
        ("json", b'{"a": [1, 2]}', {"a": [1, 2]}),
        ("txt", "caf\u00e9".encode(), "caf\u00e9"),
        ("bin", b"\x00\x01", b"\x00\x01"),
    ],
)
def test_members_decode_by_extension(ext: str, data: bytes, value: object) -> None:
    assert decode.decoded({ext: data}) == {ext: value}


def test_npy_and_images_decode_to_tensors() -> None:
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    png = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), 255, np.uint8)).save(png, format="PNG")
    out = decode.decoded({"npy": npy(array), "png": png.getvalue()})
    assert torch.equal(out["npy"], torch.from_numpy(array))
    assert out["png"].shape == (3, 4, 5)
    assert out["png"].max().item() == 1.0


def test_a_pair_takes_a_json_target_as_floats() -> None:
    _, target = decode.pair({"npy": torch.zeros(2), "json": [0.5]})
    assert target.dtype == torch.float32
    assert target.tolist() == [0.5]


def reader_batches(data: ShardStream, epoch_plan: plan.EpochPlan, rank: int) -> list[object]:
    """The rank's batches of the epoch in order, up to the first that fails (the trainer's stop)."""
    reader = PlannedReader(data, epoch_plan, rank=rank)
    got: list[object] = []
    for batch in range(epoch_plan.per_rank):
        got.append(reader[(epoch_plan.epoch, batch)])
        if isinstance(got[-1], ReadFailure):
            break
    return got


def test_a_reader_yields_the_planned_batches_of_its_rank(tmp_path: Path) -> None:
    data = stream(tmp_path, count=11, per_shard=4)
    epoch_plan = plan.first_plan(
        seed=3, epoch=1, total=11, world_size=2, batch_size=2, lanes=1, window=3
    )
    order = plan.epoch_order(data.manifest.counts, seed=3, epoch=1)
    for rank in range(2):
        got = reader_batches(data, epoch_plan, rank)
        assert all(isinstance(batch, StreamBatch) for batch in got)
        wanted = [
            [data.starts[s] + m for s, m in map(order.locate, batch)]
            for batch in plan.rank_batches(epoch_plan, rank)
        ]
        assert [b.batch[0][:, 0].tolist() for b in got] == wanted  # type: ignore[union-attr]


@pytest.mark.parametrize("on_corrupt", ["error", "skip"])
def test_a_corrupt_sample_stops_the_reader_or_is_replaced_and_counted(
    tmp_path: Path, on_corrupt: str
) -> None:
    samples = numbered(6)
    samples[2] = ("bad", {"npy": b"not an array", "cls": b"0"})
    manifest = write_shards(tmp_path, samples, per_shard=6)
    data = ShardStream(read_manifest(manifest, key="k"), on_corrupt=on_corrupt)
    epoch_plan = plan.first_plan(
        seed=0, epoch=0, total=6, world_size=1, batch_size=3, lanes=1, window=1
    )
    got = reader_batches(data, epoch_plan, 0)
    if on_corrupt == "error":
        assert isinstance(got[-1], ReadFailure)
        assert "shard-000000.tar sample 2 (bad)" in got[-1].line
        return
    assert [len(b.batch[1]) for b in got] == [3, 3]  # type: ignore[union-attr]
    assert [len(b.skipped) for b in got] == [1, 0]  # type: ignore[union-attr]
    assert "sample 2 (bad)" in got[0].skipped[0]  # type: ignore[union-attr]


def test_the_converter_writes_csv_rows_as_shards(tmp_path: Path) -> None:
    rows = "a,b,label\n" + "".join(f"{i},{i * 2},{'xy'[i % 2]}\n" for i in range(9))
    (tmp_path / "t.csv").write_text(rows)
    out = tmp_path / "out"
    assert to_shards.main(["csv", str(tmp_path / "t.csv"), str(out), "--per-shard", "4"]) == 0
    sets = shard_task.data(train=str(out / "train"))
    assert sets.train.manifest.counts == [4, 4, 1]
    inputs, target = sets.train[5]
    assert inputs.tolist() == [5.0, 10.0]
    assert int(target) == 1


def test_the_converter_writes_an_image_folder_with_its_bytes_and_classes(tmp_path: Path) -> None:
    for name in ("cat", "dog"):
        for i in range(5):
            (tmp_path / "img" / name).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((6, 4, 3), i, np.uint8)).save(
                tmp_path / "img" / name / f"{i}.png"
            )
    code = to_shards.main(
        [
            "images",
            str(tmp_path / "img"),
            str(tmp_path / "out"),
            "--val-fraction",
            "0.2",
            "--per-shard",
            "3",
        ]
    )
    assert code == 0
    sets = shard_task.data(train=str(tmp_path / "out/train"), val=str(tmp_path / "out/val"))
    assert (len(sets.train), len(sets.val)) == (8, 2)
    assert sets.train[7][0].shape == (3, 6, 4)
    assert sorted(int(sets.train[i][1]) for i in range(8)) == [0] * 4 + [1] * 4


def test_the_converter_mixes_an_image_folders_classes_over_the_shards(tmp_path: Path) -> None:
    # A folder lists its images class by class: shards written in that order would give a
    # stream's batches one class each, since a stream reads its shards front to back.
    for name in ("cat", "dog"):
        (tmp_path / "img" / name).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(
                tmp_path / "img" / name / f"{i}.png"
            )
    argv = ["images", str(tmp_path / "img"), str(tmp_path / "out"), "--val-fraction", "0",
            "--per-shard", "5"]  # fmt: skip
    assert to_shards.main(argv) == 0
    train = shard_task.data(train=str(tmp_path / "out/train")).train
    classes = [{int(train[i][1]) for i in range(start, start + 5)} for start in (0, 5, 10, 15)]
    assert classes == [{0, 1}] * 4


def test_the_converter_refuses_a_bad_input_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert to_shards.main(["images", str(tmp_path / "none"), str(tmp_path / "out")]) == 2
    assert "HINT:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"shuffle_buffer": 0}, "data.args.shuffle_buffer=0"),
        ({"lanes": -1}, "data.args.lanes=-1"),
        ({"on_corrupt": "ignore"}, "data.args.on_corrupt='ignore'"),
        ({"decode": "nosuch_module:f"}, "data.args.decode='nosuch_module:f'"),
    ],
)
def test_the_data_factory_names_a_bad_argument(
    tmp_path: Path, args: dict[str, object], says: str
) -> None:
    manifest = write_shards(tmp_path, numbered(2), per_shard=2)
    with pytest.raises(UsageError) as caught:
        shard_task.data(train=str(manifest), **args)  # type: ignore[arg-type]
    assert says in caught.value.line()


def inputs_and_key(sample: dict[str, object]) -> tuple[object, str]:
    """A user's decode function: any item it likes from the decoded members."""
    return sample["npy"], sample["cls"]


def test_a_user_decode_function_makes_the_items(tmp_path: Path) -> None:
    manifest = write_shards(tmp_path, numbered(2), per_shard=2)
    sets = shard_task.data(train=str(manifest), decode=f"{__name__}:inputs_and_key")
    inputs, label = sets.train[1]
    assert (inputs.tolist(), label) == ([1.0, 1.0], 1)
