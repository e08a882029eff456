"""Prediction's pure parts: chunking, dealing to ranks, row bytes, reusing parts, the merge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainbox.infer import chunks, part_files, rows
from trainbox.infer.chunks import Chunk


@pytest.mark.parametrize(
    ("size", "chunk_size", "bounds"),
    [
        (10, 4, [(0, 4), (4, 8), (8, 10)]),
        (8, 4, [(0, 4), (4, 8)]),
        (3, 100, [(0, 3)]),
        (1, 1, [(0, 1)]),
        (1001, 100, [(s, min(s + 100, 1001)) for s in range(0, 1001, 100)]),
    ],
)
def test_chunks_cover_every_index_once_in_order(
    size: int, chunk_size: int, bounds: list[tuple[int, int]]
) -> None:
    planned = chunks.plan(size, chunk_size)
    assert [(c.start, c.stop) for c in planned] == bounds
    assert [c.number for c in planned] == list(range(len(bounds)))
    assert sum(c.rows for c in planned) == size


@pytest.mark.parametrize(
    ("pending", "world_size", "dealt"),
    [
        ([0, 1, 2, 3, 4], 2, [[0, 1], [2, 3], [4, None]]),
        ([0, 1, 2], 3, [[0, 1, 2]]),
        ([5], 3, [[5, None, None]]),
        ([], 2, []),
        ([4, 5, 6, 7, 8, 9, 10], 1, [[4], [5], [6], [7], [8], [9], [10]]),
    ],
)
def test_rounds_deal_pending_chunks_to_ranks_in_turn(
    pending: list[int], world_size: int, dealt: list[list[int | None]]
) -> None:
    assert chunks.rounds(pending, world_size=world_size) == dealt


PROBS = [[0.1234567, 0.8765433], [1.0, 0.0]]
RENDERED = [
    # (format, classes, values, header for the width, the rows' text)
    ("csv", [1, 0], PROBS, "index,predicted,prob_0,prob_1\n", "7,1,0.123457,0.876543\n8,0,1,0\n"),
    (
        "jsonl",
        [1, 0],
        PROBS,
        "",
        '{"index":7,"predicted":1,"probabilities":[0.123457,0.876543]}\n{"index":8,"predicted":0,"probabilities":[1,0]}\n',
    ),
    ("csv", None, [[2.5], [-1e-9]], "index,predicted\n", "7,2.5\n8,-1e-09\n"),
    (
        "jsonl",
        None,
        [[2.5], [-1e-9]],
        "",
        '{"index":7,"predicted":2.5}\n{"index":8,"predicted":-1e-09}\n',
    ),
    ("csv", None, [[1.0, 2.0], [3.0, 4.0]], "index,predicted_0,predicted_1\n", "7,1,2\n8,3,4\n"),
    (
        "jsonl",
        None,
        [[1.0, 2.0], [3.0, 4.0]],
        "",
        '{"index":7,"predicted":[1,2]}\n{"index":8,"predicted":[3,4]}\n',
    ),
    ("csv", None, [[float("nan")], [float("inf")]], "index,predicted\n", "7,nan\n8,inf\n"),
    (
        "jsonl",
        None,
        [[float("nan")], [float("-inf")]],
        "",
        '{"index":7,"predicted":null}\n{"index":8,"predicted":null}\n',
    ),
]


@pytest.mark.parametrize(("fmt", "classes", "values", "header", "text"), RENDERED)
def test_rows_have_fixed_bytes(
    fmt: str, classes: list[int] | None, values: list[list[float]], header: str, text: str
) -> None:
    kind = "cross_entropy" if classes is not None else "mse"
    assert rows.header(fmt, kind, len(values[0])).decode() == header
    assert rows.render(fmt, indices=[7, 8], values=values, classes=classes).decode() == text
    if fmt == "jsonl":
        assert [json.loads(line)["index"] for line in text.splitlines()] == [7, 8]


TARGETED = [
    # (format, classes, values, targets, header, the rows' text): the data's own targets
    (
        "csv", [1, 0], PROBS, [[1], [1]],
        "index,predicted,target,prob_0,prob_1\n", "7,1,1,0.123457,0.876543\n8,0,1,1,0\n",
    ),
    (
        "jsonl", [1, 0], PROBS, [[1], [1]], "",
        '{"index":7,"predicted":1,"target":1,"probabilities":[0.123457,0.876543]}\n'
        '{"index":8,"predicted":0,"target":1,"probabilities":[1,0]}\n',
    ),
    ("csv", None, [[2.5], [-1e-9]], [[2.25], [0.0]], "index,predicted,target\n",
     "7,2.5,2.25\n8,-1e-09,0\n"),
    (
        "jsonl", None, [[2.5], [-1e-9]], [[2.25], [0.0]], "",
        '{"index":7,"predicted":2.5,"target":2.25}\n{"index":8,"predicted":-1e-09,"target":0}\n',
    ),
    (
        "csv", None, [[1.0, 2.0], [3.0, 4.0]], [[1.5, 2.5], [3.5, 4.5]],
        "index,predicted_0,predicted_1,target_0,target_1\n", "7,1,2,1.5,2.5\n8,3,4,3.5,4.5\n",
    ),
    (
        "jsonl", None, [[1.0, 2.0], [3.0, 4.0]], [[1.5, 2.5], [3.5, 4.5]], "",
        '{"index":7,"predicted":[1,2],"target":[1.5,2.5]}\n'
        '{"index":8,"predicted":[3,4],"target":[3.5,4.5]}\n',
    ),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "classes", "values", "targets", "header", "text"), TARGETED)
def test_rows_of_labelled_data_carry_the_target(
    fmt: str,
    classes: list[int] | None,
    values: list[list[float]],
    targets: list[list[float]],
    header: str,
    text: str,
) -> None:
    kind = "cross_entropy" if classes is not None else "mse"
    width, target_width = len(values[0]), len(targets[0])
    assert rows.header(fmt, kind, width, target_width=target_width).decode() == header
    rendered = rows.render(fmt, indices=[7, 8], values=values, classes=classes, targets=targets)
    assert rendered.decode() == text


def test_parts_written_without_the_target_column_are_not_reused() -> None:
    """Parts from before the column existed hold other rows: the manifest's version says so."""
    assert chunks.MANIFEST_VERSION >= 2


def test_six_significant_digits_hide_float32_noise() -> None:
    # Two float32 results that differ in the last bit print the same.
    assert (
        rows.number(0.30000001192092896, fmt="csv")
        == rows.number(0.30000004172325134, fmt="csv")
        == "0.3"
    )


MANIFEST = chunks.manifest(checkpoint_sha256="ab" * 32, split="val", size=10, chunk_size=4, output_format="csv",
                           loss="cross_entropy", batch_size=4, amp="auto", data={"factory": "m:d", "args": {"n": (1, 2)}})  # fmt: skip
PLANNED = chunks.plan(10, 4)


def _lines(count: int, first: int = 0) -> bytes:
    return b"".join(f"{i},0,1\n".encode() for i in range(first, first + count))


def test_a_fresh_parts_directory_gets_its_manifest_and_nothing_is_reused(tmp_path: Path) -> None:
    directory = part_files.directory_for(tmp_path / "out.csv")
    assert part_files.reusable(directory, MANIFEST, PLANNED, "csv") == []
    assert json.loads((directory / part_files.MANIFEST).read_text())["size"] == 10


def test_parts_of_the_same_work_are_reused(tmp_path: Path) -> None:
    directory = part_files.directory_for(tmp_path / "out.csv")
    part_files.reusable(directory, MANIFEST, PLANNED, "csv")
    part_files.write_part(directory, 0, "csv", _lines(4))
    part_files.write_part(directory, 2, "csv", _lines(2, 8))
    (directory / ".part-00000001.csv.99.tmp").write_bytes(b"0,0")  # a killed write's torso
    inode = (directory / "part-00000000.csv").stat().st_ino
    assert part_files.reusable(directory, MANIFEST, PLANNED, "csv") == [0, 2]
    assert (directory / "part-00000000.csv").stat().st_ino == inode
    assert not list(directory.glob(".*.tmp"))


@pytest.mark.parametrize("key", ["checkpoint_sha256", "size", "split", "chunk_size", "data"])
def test_parts_of_other_work_are_discarded(tmp_path: Path, key: str) -> None:
    directory = part_files.directory_for(tmp_path / "out.csv")
    part_files.reusable(directory, MANIFEST, PLANNED, "csv")
    part_files.write_part(directory, 0, "csv", _lines(4))
    other = MANIFEST | {key: "something else"}
    assert part_files.reusable(directory, other, PLANNED, "csv") == []
    assert not (directory / "part-00000000.csv").exists()
    assert json.loads((directory / part_files.MANIFEST).read_text())[key] == "something else"


def test_a_part_with_the_wrong_row_count_is_recomputed(tmp_path: Path) -> None:
    directory = part_files.directory_for(tmp_path / "out.csv")
    part_files.reusable(directory, MANIFEST, PLANNED, "csv")
    part_files.write_part(directory, 1, "csv", _lines(3, 4))
    assert part_files.reusable(directory, MANIFEST, PLANNED, "csv") == []
    assert not (directory / "part-00000001.csv").exists()


def test_merge_writes_header_and_parts_in_order_then_drops_the_parts(tmp_path: Path) -> None:
    output = tmp_path / "out.csv"
    directory = part_files.directory_for(output)
    part_files.reusable(directory, MANIFEST, PLANNED, "csv")
    for chunk in reversed(PLANNED):  # written out of order, as ranks finish
        part_files.write_part(directory, chunk.number, "csv", _lines(chunk.rows, chunk.start))
    (tmp_path / ".out.csv.123.tmp").write_bytes(b"half")  # a killed merge's torso
    part_files.merge(output, directory, PLANNED, "csv", header=b"index,a,b\n")
    assert output.read_bytes() == b"index,a,b\n" + _lines(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_a_merge_cut_short_leaves_no_file_under_the_final_name(tmp_path: Path) -> None:
    output = tmp_path / "out.csv"
    directory = part_files.directory_for(output)
    part_files.reusable(directory, MANIFEST, PLANNED, "csv")
    for chunk in PLANNED:
        part_files.write_part(directory, chunk.number, "csv", _lines(chunk.rows, chunk.start))

    def crash(count: int) -> None:
        if count == 2:
            raise KeyboardInterrupt  # stands in for a kill: nothing after this point runs

    with pytest.raises(KeyboardInterrupt):
        part_files.merge(output, directory, PLANNED, "csv", header=b"h\n", after_piece=crash)
    assert not output.exists()
    assert len(list(directory.glob("part-*.csv"))) == 3  # every part is kept for the rerun


def test_chunk_rows() -> None:
    assert Chunk(number=0, start=4, stop=8).rows == 4
