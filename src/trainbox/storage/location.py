"""Where a run_dir URL points, whether trainbox serves it, and its local working copy. Pure.

parse("s3://runs/team/run1")  ->  Location(bucket="runs", prefix="team/run1")
problems("hdfs://x/y")        ->  ["run_dir='hdfs://x/y': hdfs:// is not a store trainbox can use"]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

SCHEME = "s3"
# `scheme:` followed by slashes (or none), as people type URLs: catches `s3:/b` and `s3:b` too.
_LOOKS_LIKE_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(/*)(.*)", re.DOTALL)
# S3's own rule for new bucket names (3-63 of lowercase letters, digits, '.' and '-').
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
URL_HINT = (
    "write s3://BUCKET/PREFIX for S3 or any S3-compatible store (MinIO, Ceph, R2, GCS through"
    " its S3 API, with AWS_ENDPOINT_URL naming it), or give a file system path"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Location:
    """A prefix in a bucket of an S3-compatible store."""

    # The bucket's name.
    bucket: str
    # The prefix inside it, without leading or trailing '/' ('' for the whole bucket).
    prefix: str

    @property
    def url(self) -> str:
        """s3://BUCKET/PREFIX, as a user writes it."""
        return f"{SCHEME}://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, relative: str) -> str:
        """The object key of a path relative to the run's root."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def relative(self, key: str) -> str:
        """The path relative to the run's root of an object key under the prefix."""
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def child(self, relative: str) -> Location:
        """The location of a path below this one."""
        return Location(bucket=self.bucket, prefix=self.key(relative.strip("/")))


def is_url(text: str) -> bool:
    """Whether `text` is meant as a URL (`scheme:` then slashes), not a file path."""
    found = _LOOKS_LIKE_URL.fullmatch(text)
    # A one-letter scheme is a Windows drive (`C:/data`), never a store.
    return found is not None and len(found[1]) > 1 and (bool(found[2]) or found[1] == SCHEME)


def parse(text: str) -> Location | None:
    """The Location an s3:// URL names; None for a file path. Check `problems` first."""
    if not is_url(text):
        return None
    rest = text.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return Location(bucket=bucket, prefix=str(PurePosixPath("/", prefix))[1:].rstrip("/"))


def problems(text: str, *, what: str = "run_dir") -> list[str]:
    """Why `text` cannot name a store location (none for a good s3:// URL or a file path)."""
    found = _LOOKS_LIKE_URL.fullmatch(text)
    if not is_url(text) or found is None:
        return []
    scheme, slashes, rest = found[1], found[2], found[3]
    shown = f"{what}={text!r}"
    if scheme.lower() != SCHEME:
        return [f"{shown}: {scheme}:// is not a store trainbox can use"]
    if scheme != SCHEME or slashes != "//":
        return [f"{shown} is not a well-formed URL (s3:// takes two slashes, in lowercase)"]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        return [f"{shown} names no valid bucket ({bucket!r})"]
    if any(part in (".", "..") for part in prefix.split("/")):
        return [f"{shown} has '.' or '..' in its prefix"]
    return []


def working_copy(location: Location, env: Mapping[str, str]) -> Path:
    """The node's local folder for `location`: under $TMPDIR (else /tmp), one per bucket and prefix.

    Every process on a node uses the same one, and it is only a cache of the store: a run
    fetches into it what it needs and deletes what the store does not hold.
    """
    root = Path(env.get("TMPDIR") or "/tmp")
    return root / "trainbox-store" / location.bucket / (location.prefix or "_bucket")
