"""Checkpoints: atomic, checksummed, `latest` always loadable, old ones pruned, storage errors clear."""

from __future__ import annotations

import errno
import hashlib
import io
import multiprocessing
import os
import signal
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.serialization import get_crc32_options

from trainbox.checkpoint import files as checkpoint
from trainbox.errors import StorageError
from trainbox.testing.faults import SAVE_POINTS


def payload(step: int) -> dict[str, object]:
    return {"step": step, "model": {"w": torch.full((4,), float(step))}}


def saved(directory: Path, *steps: int) -> list[Path]:
    return [checkpoint.save(directory, step, payload(step)) for step in steps]


def files(*steps: int) -> list[str]:
    """The names checkpoints, their checksums and `latest` take on disk, sorted."""
    names = [
        name for step in steps for name in (f"step-{step:08d}.pt", f"step-{step:08d}.pt.sha256")
    ]
    return sorted([*names, "latest"] if steps else names)


def names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def latest_step(directory: Path) -> int:
    return int(checkpoint.load(directory / "latest")["step"])


def test_round_trip(tmp_path: Path) -> None:
    (path,) = saved(tmp_path, 7)
    assert path.name == "step-00000007.pt"
    loaded = checkpoint.load(path)
    assert loaded["step"] == 7
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 7.0))
    assert path.with_name(path.name + ".sha256").read_text().split()[1] == path.name


def test_no_temporary_files_are_left(tmp_path: Path) -> None:
    saved(tmp_path, 1, 2)
    assert names(tmp_path) == files(1, 2)


def test_latest_is_a_relative_link_to_the_newest(tmp_path: Path) -> None:
    saved(tmp_path, 7, 14)
    assert os.readlink(tmp_path / "latest") == "step-00000014.pt"
    moved = tmp_path.rename(tmp_path.with_name(tmp_path.name + "-moved"))
    assert latest_step(moved) == 14


def _bytes_read_by_this_thread() -> int:
    """Bytes this thread has read with read() and friends since it started (Linux)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/thread-self/io has no rchar")


def big_payload(step: int) -> dict[str, object]:
    """Two 4 MB tensors: large enough that reading the file back would show."""
    weights = {"a": torch.full((1 << 20,), float(step)), "b": torch.arange(float(1 << 20))}
    return {"step": step, "model": weights}


def test_the_sidecar_holds_the_sha256_of_the_bytes_on_disk(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 3, big_payload(3))
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert path.with_name(path.name + ".sha256").read_text() == f"{expected}  {path.name}\n"


def test_a_save_hashes_as_it_writes_and_never_reads_the_file_back(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, big_payload(1))  # imports and first-call work out of the way
    before = _bytes_read_by_this_thread()
    path = checkpoint.save(tmp_path, 2, big_payload(2))
    read = _bytes_read_by_this_thread() - before
    assert read < path.stat().st_size // 8, f"read {read} bytes of a {path.stat().st_size} file"


def test_a_load_reads_the_file_once_to_check_and_load_it(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 2, big_payload(2))
    checkpoint.load(path)
    before = _bytes_read_by_this_thread()
    loaded = checkpoint.load(path)
    read = _bytes_read_by_this_thread() - before
    # The digest is checked on a mapping of the file, and torch copies from the same pages.
    assert read < path.stat().st_size // 8, f"read {read} bytes of a {path.stat().st_size} file"
    assert torch.equal(loaded["model"]["b"], torch.arange(float(1 << 20)))


def test_a_loaded_checkpoint_holds_no_mapping_of_its_file(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 2, big_payload(2))
    loaded = checkpoint.load(path)
    # A mapping would keep a pruned checkpoint's disk space taken while the tensors live.
    assert str(path) not in Path("/proc/self/maps").read_text()
    assert torch.equal(loaded["model"]["a"], torch.full((1 << 20,), 2.0))


def test_loading_latest_checks_the_digest_of_its_target(tmp_path: Path) -> None:
    (path,) = saved(tmp_path, 7)
    _flip_a_byte(path)
    with pytest.raises(
        ValueError, match=r"latest \(step-00000007.pt\) does not match its checksum"
    ):
        checkpoint.load(tmp_path / "latest")


def test_save_passes_every_point_in_order(tmp_path: Path) -> None:
    passed: list[str] = []
    checkpoint.save(tmp_path, 7, payload(7), hook=passed.append)
    checkpoint.prune(tmp_path, keep_last=1, hook=passed.append)
    assert tuple(passed) == SAVE_POINTS


def _record(directory: Path) -> tuple[Callable[[str], None], dict[str, dict[str, int]]]:
    """A hook that notes, at each point, the size of every file in `directory` (-1: a link)."""
    seen: dict[str, dict[str, int]] = {}

    def hook(point: str) -> None:
        seen[point] = {
            p.name: -1 if p.is_symlink() else p.stat().st_size for p in directory.iterdir()
        }

    return hook, seen


def test_each_point_finds_the_save_where_it_says(tmp_path: Path) -> None:
    saved(tmp_path, 7)
    full = (tmp_path / "step-00000007.pt").stat().st_size
    hook, seen = _record(tmp_path)
    checkpoint.save(tmp_path, 14, payload(14), hook=hook)
    temp = f".step-00000014.pt.{os.getpid()}.tmp"
    assert seen["open"][temp] == 0
    assert 0 < seen["write"][temp] < full
    assert seen["fsync"][temp] == full
    assert "step-00000014.pt.sha256" in seen["sidecar"]
    assert "step-00000014.pt" not in seen["sidecar"]
    assert seen["rename"]["step-00000014.pt"] == full
    assert temp not in seen["rename"]
    assert os.readlink(tmp_path / "latest") == "step-00000014.pt"


def _clean_start() -> Any:
    """Children forked from a fresh server process, not from pytest's: a plain fork copies
    whatever lock another thread held at that moment (earlier tests leave torch's and gloo's
    threads behind), and a child stuck on one hung the unit tier once."""
    context = multiprocessing.get_context("forkserver")
    # The server imports these once; each child forks from it without importing torch again.
    context.set_forkserver_preload(["torch", "trainbox.checkpoint.files"])
    return context


def _save_and_die(directory: Path, point: str) -> None:
    """In a child: save step 14, then prune to one, SIGKILLing ourselves at `point`."""

    def hook(passed: str) -> None:
        if passed == point:
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint.save(directory, 14, payload(14), hook=hook)
    checkpoint.prune(directory, keep_last=1, hook=hook)


# (point, newest valid step, step `latest` loads, leftovers before the next prune, files after it)
CRASHES = [
    pytest.param("open", 7, 7, [".step-00000014.pt.{pid}.tmp"], files(7), id="open"),
    pytest.param("write", 7, 7, [".step-00000014.pt.{pid}.tmp"], files(7), id="write"),
    pytest.param("fsync", 7, 7, [".step-00000014.pt.{pid}.tmp"], files(7), id="fsync"),
    pytest.param("sidecar", 7, 7, [".step-00000014.pt.{pid}.tmp", "step-00000014.pt.sha256"], files(7), id="sidecar"),
    pytest.param("rename", 14, 7, [], files(7, 14), id="rename"),
    pytest.param("latest", 14, 14, [], files(7, 14), id="latest"),
    pytest.param("prune", 14, 14, ["step-00000007.pt.sha256"], files(14), id="prune"),
]  # fmt: skip


def test_the_crash_table_covers_every_save_point() -> None:
    assert tuple(row.values[0] for row in CRASHES) == SAVE_POINTS


@pytest.mark.parametrize(("point", "newest", "latest", "leftovers", "after_prune"), CRASHES)
def test_a_save_killed_at_any_point_leaves_a_loadable_latest(
    tmp_path: Path,
    point: str,
    newest: int,
    latest: int,
    leftovers: list[str],
    after_prune: list[str],
) -> None:
    saved(tmp_path, 7)
    child = _clean_start().Process(target=_save_and_die, args=(tmp_path, point))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL, "the hook never reached the point"
    for name in leftovers:
        assert (tmp_path / name.format(pid=child.pid)).exists(), name
    assert latest_step(tmp_path) == latest
    found = checkpoint.newest_valid(tmp_path)
    assert found is not None
    assert found[1]["step"] == newest
    checkpoint.prune(tmp_path, keep_last=2)
    assert names(tmp_path) == after_prune


@pytest.mark.parametrize("point", SAVE_POINTS[:5])
def test_a_first_save_cut_short_before_latest_leaves_no_latest(tmp_path: Path, point: str) -> None:
    def hook(passed: str) -> None:
        if passed == point:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 7, payload(7), hook=hook)
    assert not (tmp_path / "latest").is_symlink()
    assert not [name for name in names(tmp_path) if name.startswith(".")]


def test_prune_never_deletes_the_target_of_latest(tmp_path: Path) -> None:
    saved(tmp_path, 7)

    def stop_after_rename(point: str) -> None:
        if point == "rename":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 14, payload(14), hook=stop_after_rename)
    checkpoint.prune(tmp_path, keep_last=1)
    assert names(tmp_path) == files(7, 14)
    assert latest_step(tmp_path) == 7


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


def test_the_scan_lists_the_damaged_checkpoints_it_passed(tmp_path: Path) -> None:
    first, middle, newest = saved(tmp_path, 7, 14, 21)
    _flip_a_byte(newest)
    _truncate(middle)
    scan = checkpoint.scan(tmp_path)
    assert scan.found is not None
    assert scan.found[0] == first
    assert [path for path, _ in scan.damaged] == [newest, middle]
    assert all("checksum" in reason for _, reason in scan.damaged)


def test_damaged_checkpoints_moved_aside_are_out_of_reach_of_pruning(tmp_path: Path) -> None:
    _, newest = saved(tmp_path, 7, 14)
    _truncate(newest)
    damaged = newest.read_bytes()
    (moved,) = checkpoint.move_aside([newest])
    assert moved == tmp_path / "damaged" / newest.name
    assert moved.read_bytes() == damaged
    assert moved.with_name(moved.name + ".sha256").exists()
    # `latest` named the damaged one: it goes, rather than point at nothing.
    assert names(tmp_path) == ["damaged", "step-00000007.pt", "step-00000007.pt.sha256"]
    saved(tmp_path, 14, 21)
    checkpoint.prune(tmp_path, keep_last=1)
    assert moved.read_bytes() == damaged


def test_a_second_damaged_copy_of_a_step_is_kept_beside_the_first(tmp_path: Path) -> None:
    (path,) = saved(tmp_path, 7)
    checkpoint.move_aside([path])
    (path,) = saved(tmp_path, 7)
    (moved,) = checkpoint.move_aside([path])
    assert moved.name == "step-00000007.pt.1"
    assert sorted(p.name for p in (tmp_path / "damaged").iterdir()) == [
        "step-00000007.pt", "step-00000007.pt.1", "step-00000007.pt.1.sha256",
        "step-00000007.pt.sha256",
    ]  # fmt: skip


def test_damage_is_explained(tmp_path: Path) -> None:
    (path,) = saved(tmp_path, 3)
    _truncate(path)
    with pytest.raises(ValueError, match="does not match its checksum"):
        checkpoint.load(path)


def test_a_checkpoint_gone_before_it_is_read_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"step-00000003.pt cannot be loaded \(FileNotFoundError"):
        checkpoint.load(checkpoint.path_for(tmp_path, 3))


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    assert checkpoint.newest_valid(tmp_path / "missing") is None


Installer = Callable[[pytest.MonkeyPatch], None]


def failing(target: object, name: str, errno_: int, *, on_call: int = 1) -> Installer:
    """Make `target.name` raise OSError(errno_) on its `on_call`-th call."""

    def install(monkeypatch: pytest.MonkeyPatch) -> None:
        real = getattr(target, name)
        calls = 0

        def fake(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == on_call:
                raise OSError(errno_, os.strerror(errno_))
            return real(*args, **kwargs)

        monkeypatch.setattr(target, name, fake)

    return install


class _Filling(io.FileIO):
    """An unbuffered file on a disk with `room` bytes left: a write that does not fit fails."""

    def __init__(self, path: Path, room: int) -> None:
        super().__init__(path, "w")
        self.room = room

    def write(self, data: Any) -> int:
        chunk = bytes(memoryview(data))
        # What fits lands, as on a real disk, then the write fails.
        self.room -= super().write(chunk[: self.room])
        if len(chunk) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(chunk)


def full_disk(suffix: str, room: int) -> Installer:
    """Files opened for writing whose names end in `suffix` find only `room` bytes free."""

    def install(monkeypatch: pytest.MonkeyPatch) -> None:
        real_open = Path.open

        def open_(path: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if "w" in mode and path.name.endswith(suffix.format(pid=os.getpid())):
                # Unbuffered, so the failure reaches torch while it writes a record.
                return _Filling(path, room)
            return real_open(path, mode, *args, **kwargs)

        monkeypatch.setattr(Path, "open", open_)

    return install


# (how storage fails during the save of step 14, what the HINT tells the user to do)
STORAGE_FAULTS = [
    pytest.param(full_disk(".pt.{pid}.tmp", room=300), "free space", id="payload-write-ENOSPC"),
    pytest.param(failing(os, "fsync", errno.ENOSPC), "free space", id="payload-fsync-ENOSPC"),
    pytest.param(full_disk(".sha256.{pid}.tmp", room=0), "free space", id="sidecar-write-ENOSPC"),
    pytest.param(
        failing(os, "fsync", errno.EDQUOT, on_call=2), "free space", id="sidecar-fsync-EDQUOT"
    ),
    pytest.param(
        failing(os, "replace", errno.EACCES, on_call=2), "make run_dir writable", id="rename-EACCES"
    ),
    pytest.param(
        failing(os, "fsync", errno.EIO, on_call=3), "check the volume", id="dir-fsync-EIO"
    ),
    pytest.param(failing(os, "symlink", errno.ENOSPC), "free space", id="latest-ENOSPC"),
    pytest.param(failing(Path, "mkdir", errno.EROFS), "make run_dir writable", id="mkdir-EROFS"),
]


@pytest.mark.parametrize(("install", "remedy"), STORAGE_FAULTS)
def test_a_storage_error_keeps_the_previous_checkpoint_and_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, install: Installer, remedy: str
) -> None:
    (first,) = saved(tmp_path, 7)
    before = first.read_bytes()
    install(monkeypatch)
    with pytest.raises(StorageError) as raised:
        checkpoint.save(tmp_path, 14, payload(14))
    monkeypatch.undo()
    line = raised.value.line()
    assert "\n" not in line
    assert "step-00000014.pt" in line
    cause = raised.value.__cause__
    assert isinstance(cause, OSError)
    assert f": {os.strerror(cause.errno)}. HINT: {remedy}" in line
    assert f"{first} is the newest intact checkpoint" in line
    assert first.read_bytes() == before
    assert latest_step(tmp_path) == 7
    assert not [name for name in names(tmp_path) if name.startswith(".")]
    orphans = [
        n for n in names(tmp_path) if n.endswith(".sha256") and not (tmp_path / n[:-7]).exists()
    ]
    assert orphans == []


def test_a_storage_error_on_the_first_save_says_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing(os, "fsync", errno.ENOSPC)(monkeypatch)
    with pytest.raises(StorageError, match="no earlier checkpoint exists"):
        checkpoint.save(tmp_path, 7, payload(7))
    assert names(tmp_path) == []


def test_prune_keeps_the_newest_and_sweeps_leftovers(tmp_path: Path) -> None:
    saved(tmp_path, 1, 2, 3, 4)
    for leftover in (
        ".step-00000005.pt.99.tmp",
        ".step-00000005.pt.sha256.99.tmp",
        ".latest.99.tmp",
    ):
        (tmp_path / leftover).write_bytes(b"half")
    (tmp_path / "step-00000005.pt.sha256").write_text("orphan\n")
    checkpoint.prune(tmp_path, keep_last=2)
    assert names(tmp_path) == files(3, 4)


def test_prune_with_nothing_to_delete_still_passes_its_point(tmp_path: Path) -> None:
    saved(tmp_path, 1)
    passed: list[str] = []
    checkpoint.prune(tmp_path, keep_last=3, hook=passed.append)
    assert passed == ["prune"]
    assert names(tmp_path) == files(1)


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "step-00000001.pt"
    torch.save({"weights": 1}, path)
    with pytest.raises(ValueError, match="is not a trainbox checkpoint"):
        checkpoint.load(path)


def test_a_disk_filling_up_during_a_large_write_raises_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved(tmp_path, 7)
    # Room for part of the first 4 MB tensor: the write that fails is hashed on the side.
    full_disk(".pt.{pid}.tmp", room=2 << 20)(monkeypatch)
    with pytest.raises(StorageError, match="No space left on device"):
        checkpoint.save(tmp_path, 14, big_payload(14))
    monkeypatch.undo()
    assert latest_step(tmp_path) == 7
    assert names(tmp_path) == files(7)


def test_the_sha256_sidecar_stands_in_for_torchs_record_crc32s(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 3, big_payload(3))
    # torch.load never checks them; computing them cost a third of torch.save's time.
    with zipfile.ZipFile(path) as archive:
        assert {record.CRC for record in archive.infolist()} == {0}


def test_a_checkpoint_loads_with_plain_torch_load(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 3, big_payload(3))
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    assert loaded["step"] == 3
    assert torch.equal(loaded["model"]["b"], torch.arange(float(1 << 20)))


def test_a_save_leaves_the_process_wide_crc32_option_alone(tmp_path: Path) -> None:
    seen: list[bool] = []
    # "write" passes inside torch's serialisation: any torch.save elsewhere would see this.
    checkpoint.save(tmp_path, 3, big_payload(3), hook=lambda _: seen.append(get_crc32_options()))
    assert seen
    assert all(seen)
    assert get_crc32_options()


def test_a_checkpoint_written_with_record_crc32s_loads_and_verifies(tmp_path: Path) -> None:
    # What checkpoint.save wrote before the CRC32s were left out: torch.save's bytes, hashed.
    path = checkpoint.path_for(tmp_path, 5)
    with path.open("wb") as handle:
        torch.save(big_payload(5), handle)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    assert checkpoint.load(path)["step"] == 5
    _flip_a_byte(path)
    with pytest.raises(ValueError, match="does not match its checksum"):
        checkpoint.load(path)


def test_a_legacy_format_file_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "step-00000001.pt"
    torch.save(payload(1), path, _use_new_zipfile_serialization=False)
    assert checkpoint.load(path)["step"] == 1
