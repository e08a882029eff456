"""The image-folder data factory: layouts, splits, seeded augmentation, one-line errors."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from trainbox.errors import UsageError
from trainbox.tasks import images
from trainbox.train.data import contract
from trainbox.train.data.map_style import Position, TrainBatches
from trainbox.train.data.seam import Loading


def save(path: Path, size: tuple[int, int] = (12, 10), value: int = 0) -> None:
    """A `size` (width, height) RGB image whose pixels encode their position, plus `value`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    grid = (np.arange(width * height * 3).reshape(height, width, 3) + value) % 256
    Image.fromarray(grid.astype(np.uint8)).save(path)


def folder(root: Path, counts: dict[str, int], ext: str = "png") -> Path:
    for name, count in counts.items():
        for i in range(count):
            save(root / name / f"{i}.{ext}", value=i)
    return root


def error(**kwargs: object) -> str:
    with pytest.raises(UsageError) as caught:
        images.data(**kwargs)  # type: ignore[arg-type]
    return caught.value.line()


def test_class_subdirectories_are_labels_in_name_order(tmp_path: Path) -> None:
    got = images.data(root=str(folder(tmp_path, {"dog": 2, "cat": 3})), val_fraction=0)
    assert isinstance(got, contract.Datasets)
    assert got.train.classes == ("cat", "dog")
    assert sorted(got.train.labels) == [0, 0, 0, 1, 1]
    assert got.val is None


def test_items_are_float_chw_tensors_and_int_labels(tmp_path: Path) -> None:
    train = images.data(root=str(folder(tmp_path, {"a": 1, "b": 1})), val_fraction=0).train
    inputs, label = train[1]
    assert inputs.shape == (3, 10, 12)
    assert inputs.dtype == torch.float32
    assert inputs.min() >= 0
    assert inputs.max() <= 1
    assert label == 1


def test_grayscale_has_one_channel(tmp_path: Path) -> None:
    root = folder(tmp_path, {"a": 1, "b": 1}, ext="jpg")
    assert images.data(root=str(root), channels=1, val_fraction=0).train[0][0].shape == (1, 10, 12)


def test_decoding_dataset_leaves_workers_to_the_plan(tmp_path: Path) -> None:
    got = images.data(root=str(folder(tmp_path, {"a": 2, "b": 2})))
    assert got.max_workers is None


def test_val_tree_is_the_val_set(tmp_path: Path) -> None:
    folder(tmp_path / "train", {"a": 3, "b": 3})
    folder(tmp_path / "val", {"b": 1})
    got = images.data(root=str(tmp_path))
    assert len(got.train) == 6
    assert got.val.classes == ("a", "b")
    assert got.val.labels == (1,)


def test_val_fraction_is_seeded_per_class_and_disjoint(tmp_path: Path) -> None:
    root = str(folder(tmp_path, {"a": 10, "b": 10}))
    one, same = images.data(root=root, val_fraction=0.2), images.data(root=root, val_fraction=0.2)
    other = images.data(root=root, val_fraction=0.2, seed=1)
    assert one.val.files == same.val.files
    assert one.val.files != other.val.files
    assert sorted(one.val.labels) == [0, 0, 1, 1]
    assert not set(one.val.files) & set(one.train.files)
    assert len(one.train) + len(one.val) == 20


def test_val_fraction_keeps_one_image_of_a_class_in_train(tmp_path: Path) -> None:
    got = images.data(root=str(folder(tmp_path, {"a": 1, "b": 4})), val_fraction=0.5)
    assert got.train.labels.count(0) == 1


@pytest.mark.parametrize(
    ("key", "expect"),
    [
        ({"seed": 0, "epoch": 0, "index": 5}, "same"),
        ({"seed": 1, "epoch": 0, "index": 5}, "other seed"),
        ({"seed": 0, "epoch": 1, "index": 5}, "other epoch"),
    ],
)
def test_draw_is_a_function_of_seed_epoch_and_index(key: dict[str, int], expect: str) -> None:
    shapes = {"image": (64, 64), "crop": (8, 8), "flip": True}
    base = images.draw(seed=0, epoch=0, index=5, **shapes)
    got = images.draw(**key, **shapes)
    assert (got == base) is (expect == "same")


def test_draws_cover_the_crop_positions_and_both_flips() -> None:
    draws = [
        images.draw(seed=0, epoch=0, index=i, image=(10, 12), crop=(8, 8), flip=True)
        for i in range(400)
    ]
    assert {d.top for d in draws} == {0, 1, 2}
    assert {d.left for d in draws} == {0, 1, 2, 3, 4}
    assert {d.flip for d in draws} == {True, False}
    assert not any(
        images.draw(seed=0, epoch=0, index=i, image=(10, 12), crop=(8, 8), flip=False).flip
        for i in range(50)
    )


def test_augmented_item_is_the_drawn_crop(tmp_path: Path) -> None:
    root = folder(tmp_path, {"a": 4, "b": 4})
    train = images.data(root=str(root), crop=8, val_fraction=0).train
    whole = images.data(root=str(root), val_fraction=0, flip=False).train
    for index in range(len(train)):
        where = images.draw(seed=0, epoch=0, index=index, image=(10, 12), crop=(8, 8), flip=True)
        expected = whole[index][0][:, where.top : where.top + 8, where.left : where.left + 8]
        assert torch.equal(train[index][0], expected.flip(-1) if where.flip else expected)


def test_set_epoch_changes_the_augmentation(tmp_path: Path) -> None:
    train = images.data(root=str(folder(tmp_path, {"a": 8, "b": 8})), crop=6, val_fraction=0).train
    first = [train[i][0] for i in range(len(train))]
    train.set_epoch(1)
    assert any(not torch.equal(a, train[i][0]) for i, a in enumerate(first))


def test_val_items_are_centre_crops_without_flips(tmp_path: Path) -> None:
    folder(tmp_path / "train", {"a": 1})
    save(tmp_path / "val" / "a" / "x.png")
    val = images.data(root=str(tmp_path), crop=[6, 8], flip=True).val
    whole = images.data(root=str(tmp_path)).val[0][0]
    assert torch.equal(val[0][0], whole[:, 2:8, 2:10])


def test_items_are_the_same_at_any_worker_count(tmp_path: Path) -> None:
    train = images.data(root=str(folder(tmp_path, {"a": 6, "b": 6})), crop=7, val_fraction=0).train
    batches = {
        workers: [b[0] for b in DataLoader(train, batch_size=4, num_workers=workers)]
        for workers in (0, 2)
    }
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[2], strict=True))


def test_dataset_pickles_for_spawned_workers(tmp_path: Path) -> None:
    train = images.data(root=str(folder(tmp_path, {"a": 2, "b": 2})), crop=5).train
    copy = pickle.loads(pickle.dumps(train))
    assert torch.equal(copy[1][0], train[1][0])


def test_resize_makes_mixed_sizes_one_shape(tmp_path: Path) -> None:
    save(tmp_path / "a" / "small.png", size=(8, 8))
    save(tmp_path / "b" / "big.png", size=(20, 16))
    train = images.data(root=str(tmp_path), size=[12, 14], val_fraction=0).train
    assert {tuple(train[i][0].shape) for i in range(2)} == {(3, 12, 14)}


def test_missing_directory_is_named(tmp_path: Path) -> None:
    line = error(root=str(tmp_path / "nope"))
    assert f"{tmp_path / 'nope'} is not a directory" in line
    assert f"HINT: put images in {tmp_path / 'nope'}/CLASS/NAME.png" in line


def test_no_class_subdirectories(tmp_path: Path) -> None:
    save(tmp_path / "loose.png")
    assert f"{tmp_path} has no class subdirectories" in error(root=str(tmp_path))


def test_class_without_images_is_named(tmp_path: Path) -> None:
    folder(tmp_path, {"a": 2})
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("x")
    assert f"{tmp_path / 'b'} has no .png, .jpg or .jpeg files" in error(root=str(tmp_path))


def test_unreadable_files_are_all_named_at_once(tmp_path: Path) -> None:
    folder(tmp_path, {"a": 2, "b": 2})
    (tmp_path / "a" / "bad.png").write_bytes(b"not a png")
    (tmp_path / "b" / "worse.jpg").write_bytes(b"")
    line = error(root=str(tmp_path))
    assert f"{tmp_path / 'a' / 'bad.png'} cannot be read as an image" in line
    assert f"{tmp_path / 'b' / 'worse.jpg'} cannot be read as an image" in line
    assert f"set data.args.size (in {tmp_path})" in line


def test_truncated_pixels_fail_naming_the_file(tmp_path: Path) -> None:
    folder(tmp_path, {"a": 1, "b": 1})
    path = tmp_path / "a" / "0.png"
    path.write_bytes(path.read_bytes()[:60])
    train = images.data(root=str(tmp_path), val_fraction=0).train
    with pytest.raises(UsageError, match=r"0\.png cannot be decoded"):
        train[0]


def test_mixed_sizes_need_a_size(tmp_path: Path) -> None:
    save(tmp_path / "a" / "one.png", size=(8, 8))
    save(tmp_path / "b" / "two.png", size=(9, 8))
    line = error(root=str(tmp_path))
    assert "images differ in size" in line
    assert "data.args.size is not set" in line


def test_val_class_unknown_to_train(tmp_path: Path) -> None:
    folder(tmp_path / "train", {"a": 1, "b": 1})
    folder(tmp_path / "val", {"c": 1})
    line = error(root=str(tmp_path))
    assert f"{tmp_path / 'val' / 'c'} is a class that {tmp_path / 'train'} does not have" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"crop": 0}, "data.args.crop=0 must be a positive int"),
        ({"size": [1, 2, 3]}, "data.args.size=[1, 2, 3] must be"),
        ({"channels": 2}, "data.args.channels=2 must be 1 or 3"),
        ({"val_fraction": 1.0}, "data.args.val_fraction=1.0 must be"),
        ({"crop": 11}, "data.args.crop=[11, 11] is larger than the images ([10, 12])"),
    ],
)
def test_bad_arguments(tmp_path: Path, args: dict[str, object], message: str) -> None:
    assert message in error(root=str(folder(tmp_path, {"a": 1, "b": 1})), **args)


def test_model_gives_logits_for_any_image_size() -> None:
    net = images.model(classes=4, channels=1)
    assert net(torch.zeros(2, 1, 9, 13)).shape == (2, 4)


def test_val_tree_without_a_train_tree(tmp_path: Path) -> None:
    folder(tmp_path / "val", {"a": 1})
    assert f"{tmp_path / 'train'} is missing (there is a val/ tree)" in error(root=str(tmp_path))


def epochs(
    train: images.ImageFiles, *, workers: int, count: int, start: int = 0
) -> list[list[bytes]]:
    """Each epoch's augmented items as trainbox's batches deliver them, in a canonical order.

    One rank sees every item once per epoch (16 items, batches of 4), so an epoch that repeats
    the previous one's crops and flips gives the same sorted list whatever the shuffle did.
    """
    source = TrainBatches(
        train,
        Loading(batch_size=4, rank=0, world_size=1, seed=0, num_workers=workers, pin_memory=False),
    )
    stream = source.iterate(Position(epoch=start, batch=0))
    items: list[list[bytes]] = []
    for _ in range(count):
        batches = itertools.islice(stream, source.per_epoch)
        items.append(sorted(image.numpy().tobytes() for inputs, _ in batches for image in inputs))
    return items


@pytest.mark.parametrize("workers", [0, 2])
def test_augmentation_differs_from_epoch_to_epoch(tmp_path: Path, workers: int) -> None:
    train = images.data(root=str(folder(tmp_path, {"a": 8, "b": 8})), crop=6, val_fraction=0).train
    first, second, third = epochs(train, workers=workers, count=3)
    assert first != second
    assert second != third


def test_augmentation_is_the_same_at_any_worker_count_and_start(tmp_path: Path) -> None:
    train = images.data(root=str(folder(tmp_path, {"a": 8, "b": 8})), crop=6, val_fraction=0).train
    in_process = epochs(train, workers=0, count=3)
    assert epochs(train, workers=2, count=3) == in_process
    # A run resumed at the start of epoch 2 sees what the uninterrupted run saw there.
    assert epochs(train, workers=2, count=1, start=2) == in_process[2:]
