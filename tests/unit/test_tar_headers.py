"""The plain tar header reader (streams/headers.py) gives what tarfile gives: the same file
members, named alike, or it leaves the tar to tarfile; so a cursor reads the same samples and
fails with the same lines as one that reads every tar through tarfile."""

from __future__ import annotations

import contextlib
import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainbox.streams import headers
from trainbox.streams.shards import Cursor, Shard, ShardFault, write_shard

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
# Member names: short, in folders, long enough for a USTAR prefix or a long-name header.
NAMES = st.sampled_from(["a", "k1", "dir/k2", "d" * 60 + "/" + "k" * 60, "n" * 120, "é/k3"])
MEMBERS = st.lists(
    st.tuples(
        NAMES,
        st.sampled_from(["npy", "cls", "input.png"]),
        st.integers(min_value=0, max_value=1100),
        st.sampled_from(["file", "file", "file", "folder", "link"]),
    ),
    max_size=8,
)


def tar_bytes(members: list[tuple[str, str, int, str]], form: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=FORMATS[form]) as tar:
        for number, (key, ext, size, kind) in enumerate(members):
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.mtime, info.mode = 0, 0o644
            data = None
            if kind == "folder":
                info.type, info.name = tarfile.DIRTYPE, key
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "elsewhere"
            else:
                info.size, data = size, io.BytesIO(bytes([number % 251]) * size)
            # A name too long for USTAR is left out: the header is refused before any is written.
            with contextlib.suppress(ValueError):
                tar.addfile(info, data)
    return buffer.getvalue()


def by_tarfile(data: bytes) -> list[tuple[str, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [(i.name, i.size, i.offset_data) for i in tar if i.isfile()]


@settings(max_examples=150, deadline=None)
@given(
    members=MEMBERS,
    form=st.sampled_from(sorted(FORMATS)),
    cut=st.one_of(st.none(), st.integers(min_value=0, max_value=12_000)),
)
def test_the_plain_reader_lists_what_tarfile_lists_or_leaves_the_tar_to_it(
    members: list[tuple[str, str, int, str]], form: str, cut: int | None
) -> None:
    data = tar_bytes(members, form)[:cut]
    try:
        found = list(headers.file_members(io.BytesIO(data)))
    except headers.NotPlain:
        return
    assert found == by_tarfile(data)


def test_the_converters_tars_and_gnu_tars_need_no_tarfile() -> None:
    for form in ("ustar", "gnu"):
        data = tar_bytes([("k1", "npy", 700, "file"), ("dir/k2", "cls", 1, "file")], form)
        assert list(headers.file_members(io.BytesIO(data))) == by_tarfile(data)


@settings(max_examples=60, deadline=None)
@given(
    members=MEMBERS,
    form=st.sampled_from(sorted(FORMATS)),
    cut=st.one_of(st.none(), st.integers(min_value=0, max_value=12_000)),
)
def test_a_cursor_reads_the_samples_and_fails_with_the_lines_tarfile_gives(
    tmp_path_factory: pytest.TempPathFactory,
    members: list[tuple[str, str, int, str]],
    form: str,
    cut: int | None,
) -> None:
    path = tmp_path_factory.mktemp("tar") / "shard.tar"
    path.write_bytes(tar_bytes(members, form)[:cut])
    shard = Shard(location=str(path), samples=len(members) + 1, size=path.stat().st_size)
    plain, reference = Cursor(), Cursor(plain=False)
    # Forward, then back to the start (a reopen), as a resume or an evaluation reads.
    for member in [*range(len(members) + 1), 0]:
        assert outcome(plain, shard, member) == outcome(reference, shard, member)


def outcome(cursor: Cursor, shard: Shard, member: int) -> object:
    try:
        return cursor.read(shard, member)
    except ShardFault as fault:
        return fault.line


def test_a_shard_the_converter_wrote_reads_alike_both_ways(tmp_path: Path) -> None:
    samples = [(f"{i:04d}", {"npy": bytes(i), "cls": b"1"}) for i in range(30)]
    path = tmp_path / "s.tar"
    shard = Shard(location=str(path), samples=write_shard(path, samples), size=0)
    plain, reference = Cursor(), Cursor(plain=False)
    for member in (0, 7, 29, 3):
        assert plain.read(shard, member) == reference.read(shard, member) == samples[member]


@pytest.mark.parametrize(
    "mode",
    [b"0000644\0", b"    644 ", b" 644\0 xx", b"644\0\0\0\0\0", b"\0" * 8, b"0000649\0", b"\x1c644\0\0\0\0",
     b"\x80\0\0\0\0\0\1\xa4", b"+644\0\0\0\0", b"6_44\0\0\0\0", b"64 4\0\0\0\0"],
)  # fmt: skip
def test_a_number_field_is_read_as_tarfile_reads_it_or_left_to_it(mode: bytes) -> None:
    header = bytearray(tar_bytes([("k1", "npy", 3, "file")], "ustar")[: 3 * 512])
    header[100:108] = mode
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header[:512])
    data = bytes(header)
    try:
        found = list(headers.file_members(io.BytesIO(data)))
    except headers.NotPlain:
        return
    assert found == by_tarfile(data)
