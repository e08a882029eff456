"""`to_shards index`: a manifest for tar shards made elsewhere, with each tar's samples counted
as the reader groups them, and bad input refused in one line naming the file, with no
manifest written."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from trainbox.streams.shards import MANIFEST, Cursor, ShardFault, read_manifest, write_shards
from trainbox.tasks import shards as shard_task
from trainbox.tasks import to_shards

from stream_shards import numbered, webdataset, write_tar


def index(*argv: object) -> int:
    return to_shards.main(["index", *map(str, argv)])


def shard(path: Path, first: int, count: int) -> Path:
    """A tar of `count` samples in the WebDataset naming (KEY.input.npy, KEY.label.cls)."""
    samples = webdataset(first, count)
    return write_tar(
        path, [(f"{key}.{ext}", data) for key, m in samples for ext, data in m.items()]
    )


def directory_entry(name: str) -> tarfile.TarInfo:
    """A folder entry, as `tar -cf` of a directory writes one."""
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info


def test_indexing_a_folder_lists_its_tars_by_name_with_counts_and_sizes(tmp_path: Path) -> None:
    folder = tmp_path / "train"
    shard(folder / "part-001.tar", 3, 2)
    shard(folder / "part-000.tar", 0, 3)
    assert index(folder) == 0
    written = json.loads((folder / MANIFEST).read_text())
    assert written == {
        "format": "trainbox-shards/1",
        "shards": [
            {"path": name, "samples": count, "bytes": (folder / name).stat().st_size}
            for name, count in (("part-000.tar", 3), ("part-001.tar", 2))
        ],
    }


def test_an_indexed_set_trains_with_the_default_decoder(tmp_path: Path) -> None:
    shard(tmp_path / "a.tar", 0, 3)
    shard(tmp_path / "b.tar", 3, 4)
    assert index(tmp_path) == 0
    data = shard_task.data(train=str(tmp_path)).train
    assert len(data) == 7
    assert [(data[i][0].tolist(), int(data[i][1])) for i in range(7)] == [
        ([i, i], i % 3) for i in range(7)
    ]


def test_indexing_the_converters_shards_gives_the_converters_manifest(tmp_path: Path) -> None:
    manifest = write_shards(tmp_path / "set", numbered(7), per_shard=3)
    written = manifest.read_text()
    manifest.unlink()
    assert index(manifest.parent) == 0
    assert json.loads(manifest.read_text()) == json.loads(written)


@pytest.mark.parametrize(
    ("members", "count"),
    [
        (["a.npy", "a.cls", "b.npy", "b.cls"], 2),
        (["a.input.npy", "a.label.cls", "b.input.npy"], 2),
        (["d/x.jpg", "d/x.cls", "e/x.jpg", "e/x.cls"], 2),
        (["./a.npy", "./a.cls"], 1),
        ([directory_entry("d"), "d/x.jpg", "d/x.cls"], 1),
    ],
)
def test_a_tars_samples_are_its_runs_of_members_with_one_key(
    tmp_path: Path, members: list[str | tarfile.TarInfo], count: int
) -> None:
    path = write_tar(
        tmp_path / "shards" / "one.tar",
        [m if isinstance(m, tarfile.TarInfo) else (m, b"1") for m in members],
    )
    assert index(path.parent) == 0
    counted = read_manifest(path.parent, key="k").shards[0]
    assert counted.samples == count
    # The reader sees exactly that many samples: each reads, the one after does not.
    cursor = Cursor()
    assert len({cursor.read(counted, i)[0] for i in range(count)}) == count
    with pytest.raises(ShardFault, match="ends before sample"):
        cursor.read(counted, count)


def test_a_manifest_file_elsewhere_lists_the_shards_relative_to_it(tmp_path: Path) -> None:
    first = shard(tmp_path / "data" / "ds-train-0.tar", 0, 2)
    second = shard(tmp_path / "data" / "ds-train-1.tar", 2, 3)
    out = tmp_path / "manifests" / "train.json"
    assert index(out, first, second) == 0
    entries = json.loads(out.read_text())["shards"]
    assert [e["path"] for e in entries] == ["../data/ds-train-0.tar", "../data/ds-train-1.tar"]
    assert len(shard_task.data(train=str(out)).train) == 5


def test_train_and_val_shards_of_one_folder_get_a_manifest_each(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name, first, count in (("train-0", 0, 4), ("train-1", 4, 3), ("val-0", 7, 2)):
        shard(data / f"ds-{name}.tar", first, count)
    assert index(data / "train.json", data / "ds-train-*.tar") == 0
    assert index(data / "val.json", data / "ds-val-*.tar") == 0
    sets = shard_task.data(train=str(data / "train.json"), val=str(data / "val.json"))
    assert (len(sets.train), len(sets.val)) == (7, 2)
    assert sets.val[1][0].tolist() == [8, 8]


def test_shards_keep_the_order_given_and_each_folder_or_pattern_sorts_its_own(
    tmp_path: Path,
) -> None:
    for name in ("b/2.tar", "b/1.tar", "c-1.tar", "c-0.tar", "a.tar"):
        shard(tmp_path / name, 0, 1)
    out = tmp_path / "m.json"
    assert index(out, tmp_path / "b", tmp_path / "c-*.tar", tmp_path / "a.tar") == 0
    listed = [e["path"] for e in json.loads(out.read_text())["shards"]]
    assert listed == ["b/1.tar", "b/2.tar", "c-0.tar", "c-1.tar", "a.tar"]


def cut(at: int) -> Callable[[Path], None]:
    """A shard of 3 samples (each member one 512-byte header and one block of data) cut to
    `at` bytes."""

    def make(path: Path) -> None:
        path.write_bytes(shard(path, 0, 3).read_bytes()[:at])

    return make


def member_boundary(path: Path) -> None:
    """A shard cut right after its last member: no end-of-archive blocks."""
    shard(path, 0, 3)
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    path.write_bytes(path.read_bytes()[: last.offset_data + 512])


def link(path: Path) -> None:
    info = tarfile.TarInfo("a.input.npy")
    info.type, info.linkname = tarfile.SYMTYPE, "elsewhere.npy"
    write_tar(path, [info, ("a.label.cls", b"1")])


BAD: dict[str, tuple[Callable[[Path], object], str]] = {
    "missing": (lambda _: None, "does not exist"),
    "not a tar": (lambda path: path.write_text("key,label\n1,2\n" * 100), "is not a tar"),
    "compressed": (
        lambda path: path.write_bytes(gzip.compress(shard(path, 0, 2).read_bytes())),
        "gzip-compressed",
    ),
    "cut in a member": (cut(512 * 9 + 50), "cut short"),
    "cut in a header": (cut(512 * 4 + 200), "cut short"),
    "cut after a member": (member_boundary, "cut short"),
    "empty": (lambda path: write_tar(path, []), "holds no samples"),
    "zero bytes": (lambda path: path.write_bytes(b""), "is empty"),
    "key again": (
        lambda path: write_tar(path, [("a.npy", b"1"), ("b.npy", b"1"), ("a.cls", b"1")]),
        "key a again at member a.cls",
    ),
    "member twice": (
        lambda path: write_tar(path, [("a.npy", b"1"), ("a.npy", b"2")]),
        "a.npy twice",
    ),
    "link": (link, "a.input.npy is a link"),
    "no extension": (lambda path: write_tar(path, [("a", b"1")]), "a has no extension"),
    "no key": (lambda path: write_tar(path, [("._a.npy", b"1")]), "._a.npy has no key"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_shard_is_one_line_naming_it_and_no_manifest_is_written(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = shard(tmp_path / "shards" / "good.tar", 0, 2)
    bad = tmp_path / "shards" / "bad.tar"
    make, says = BAD[case]
    make(bad)
    out = tmp_path / "out"
    assert index(out, good, bad) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: {bad}")
    assert says in err
    assert "HINT: " in err
    assert not out.exists()


def test_every_bad_shard_is_named_and_an_old_manifest_stays_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "set"
    write_shards(folder, numbered(4), per_shard=2)
    before = (folder / MANIFEST).read_bytes()
    (folder / "shard-000000.tar").write_bytes(b"")
    write_tar(folder / "shard-000002.tar", [])
    assert index(folder) == 2
    err = capsys.readouterr().err
    assert "shard-000000.tar is empty" in err
    assert "shard-000002.tar holds no samples" in err
    assert (folder / MANIFEST).read_bytes() == before
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # no temp file left


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["{tmp}/empty"], "{tmp}/empty holds no .tar files"),
        (["{tmp}/out", "{tmp}/none-*.tar"], "{tmp}/none-*.tar matches no file"),
        (["{tmp}/absent"], "{tmp}/absent is not a folder: list the shards after it"),
        (
            ["{tmp}/file.txt", "{tmp}/s.tar"],
            "{tmp}/file.txt is a file: give a folder for manifest.json, or a path ending in .json",
        ),
        (["{tmp}/out", "{tmp}/s.tar", "{tmp}/*.tar"], "{tmp}/s.tar is listed twice"),
    ],
)
def test_an_output_or_shards_that_cannot_make_a_manifest_are_refused(
    tmp_path: Path, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    shard(tmp_path / "s.tar", 0, 1)
    assert index(*[a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {says.format(tmp=tmp_path)}. HINT: {to_shards.INDEX_HINT}\n"
    assert not (tmp_path / "out").exists()


def test_the_module_indexes_from_the_command_line(tmp_path: Path) -> None:
    shard(tmp_path / "s" / "a.tar", 0, 2)
    (tmp_path / "s" / "b.tar").write_bytes(b"")
    command = [sys.executable, "-m", "trainbox.tasks.to_shards", "index", str(tmp_path / "s")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {tmp_path / 's' / 'b.tar'} is empty")
    (tmp_path / "s" / "b.tar").unlink()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, f"{tmp_path / 's' / MANIFEST}\n")
