"""Plain tar headers read without tarfile: the file members of a shard whose headers are all
plain ones (USTAR or GNU regular files and folders, as trainbox's converter, GNU tar and
WebDataset's writers make them), each field read as tarfile reads it, for a fraction of
tarfile's cost per member. At any other header the reader stops, and tarfile reads the shard.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from typing import IO

BLOCK = tarfile.BLOCKSIZE
# How tarfile decodes the names it reads.
ENCODING, ERRORS = tarfile.ENCODING, "surrogateescape"
# The number fields tarfile reads from every header: mode, uid, gid, size, mtime, checksum and
# the device numbers. One it cannot read ends its reading of the tar, so it stops this reader.
NUMBERS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156), (329, 337),
           (337, 345))  # fmt: skip
SIZE, CHECKSUM = 3, 5
# Those numbers as tarfile and GNU tar write them: mode, uid, gid (7 octal digits and a NUL),
# size and mtime (11 and a NUL) and the checksum (6, a NUL and a space); the device numbers the
# same as the mode, or NULs.
WRITTEN = re.compile(rb"(?:[0-7]{7}\0){3}(?:[0-7]{11}\0){2}[0-7]{6}\0 ")
DEVICES = re.compile(rb"(?:[0-7]{7}\0|\0{8}){2}")
FILE, OLD_FILE, FOLDER = tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE


class NotPlain(Exception):
    """A header left to tarfile: a pax or GNU long-name header, a link, a sparse file, a
    base-256 number, a bad checksum, or a file that ends without an end-of-archive block."""


def file_members(handle: IO[bytes]) -> Iterator[tuple[str, int, int]]:
    """(name, size, offset of its data) of each file member of the tar `handle` holds, in
    order, named as tarfile names it; folders are passed over. NotPlain at a header that only
    tarfile reads, or where tarfile would stop or fail. `handle` is seekable, and is moved."""
    offset = 0
    while True:
        handle.seek(offset)
        header = handle.read(BLOCK)
        if len(header) != BLOCK:
            raise NotPlain
        if header.count(b"\0") == BLOCK:
            return  # the end-of-archive block
        name, kind, size = _parsed(header)
        offset += BLOCK
        if kind == FOLDER:
            if size:
                # tarfile would read a folder's data as the next header.
                raise NotPlain
            continue
        yield name, size, offset
        offset += -(-size // BLOCK) * BLOCK


def _parsed(header: bytes) -> tuple[str, bytes, int]:
    """(name, type, size) of a plain header, as tarfile.TarInfo.frombuf reads them."""
    kind = header[156:157]
    if kind not in (FILE, OLD_FILE, FOLDER):
        raise NotPlain
    if WRITTEN.fullmatch(header, 100, 156) and DEVICES.fullmatch(header, 329, 345):
        # Every number as writers write them (tarfile, GNU tar): valid at a glance.
        size, checksum = int(header[124:135], 8), int(header[148:154], 8)
    else:
        numbers = [_number(header[lo:hi]) for lo, hi in NUMBERS]
        size, checksum = numbers[SIZE], numbers[CHECKSUM]
    # The sum of the bytes with the checksum's own 8 as spaces (NULs add nothing, and most of a
    # header is NULs). tarfile also takes a sum of signed bytes, which old writers made: left
    # to it.
    if checksum != 256 + sum(header.translate(None, b"\0")) - sum(header[148:156]) or size < 0:
        raise NotPlain
    name = _text(header[0:100])
    if kind == OLD_FILE and name.endswith("/"):
        return name, FOLDER, size
    # The USTAR prefix (tarfile joins it whenever it is not empty, as here).
    prefix = _text(header[345:500])
    return (f"{prefix}/{name}" if prefix else name), kind, size


def _number(field: bytes) -> int:
    """An octal number field as tarfile reads it; NotPlain for base-256 or what it refuses."""
    digits = field.partition(b"\0")[0].strip()
    if not digits.strip(b"01234567"):
        # Octal digits alone, as writers write them: what tarfile reads, read at less cost.
        return int(digits or b"0", 8)
    if field[0] in (0o200, 0o377):
        raise NotPlain
    try:
        return int(field.partition(b"\0")[0].decode("ascii").strip() or "0", 8)
    except ValueError:
        raise NotPlain from None


def _text(field: bytes) -> str:
    """A NUL-terminated text field as tarfile reads it."""
    return field.partition(b"\0")[0].decode(ENCODING, ERRORS)
