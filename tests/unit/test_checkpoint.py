"""Checkpoints: atomic, checksummed, newest valid one wins, old ones pruned."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainbox.train import checkpoint


def payload(step: int) -> dict[str, object]:
    return {"step": step, "model": {"w": torch.full((4,), float(step))}}


def saved(directory: Path, *steps: int) -> list[Path]:
    return [checkpoint.save(directory, step, payload(step)) for step in steps]


def files(*steps: int) -> list[str]:
    """The names a checkpoint and its checksum take on disk, sorted."""
    return sorted(
        name for step in steps for name in (f"step-{step:08d}.pt", f"step-{step:08d}.pt.sha256")
    )


def test_round_trip(tmp_path: Path) -> None:
    (path,) = saved(tmp_path, 7)
    assert path.name == "step-00000007.pt"
    loaded = checkpoint.load(path)
    assert loaded["step"] == 7
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 7.0))
    assert path.with_name(path.name + ".sha256").read_text().split()[1] == path.name


def test_no_temporary_files_are_left(tmp_path: Path) -> None:
    saved(tmp_path, 1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == files(1, 2)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate_without_checksum(path: Path) -> None:
    _truncate(path)
    path.with_name(path.name + ".sha256").unlink()


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte, _truncate_without_checksum])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    first, newest = saved(tmp_path, 7, 14)
    damage(newest)
    found = checkpoint.newest_valid(tmp_path)
    assert found is not None
    assert (found[0], found[1]["step"]) == (first, 7)


def test_damage_is_explained(tmp_path: Path) -> None:
    (path,) = saved(tmp_path, 3)
    _truncate(path)
    with pytest.raises(ValueError, match="does not match its checksum"):
        checkpoint.load(path)


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    assert checkpoint.newest_valid(tmp_path / "missing") is None


def test_an_interrupted_save_leaves_the_previous_checkpoint_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (first,) = saved(tmp_path, 7)

    def crash(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(tmp_path, 14, payload(14))
    assert [p.name for p in checkpoint.existing(tmp_path)] == [first.name]
    assert not list(tmp_path.glob(".*tmp"))


def test_prune_keeps_the_newest_and_sweeps_leftovers(tmp_path: Path) -> None:
    saved(tmp_path, 1, 2, 3, 4)
    (tmp_path / ".step-00000005.pt.99.tmp").write_bytes(b"half")
    checkpoint.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == files(3, 4)


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "step-00000001.pt"
    torch.save({"weights": 1}, path)
    with pytest.raises(ValueError, match="is not a trainbox checkpoint"):
        checkpoint.load(path)
