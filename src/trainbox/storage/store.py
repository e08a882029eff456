"""The one place trainbox talks to an object store: list, upload, download, delete, probe.

boto3 reads credentials and the endpoint as the AWS CLI does (AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE and ~/.aws, web identity for IRSA,
instance and container roles, AWS_ENDPOINT_URL); trainbox passes none of them and logs none.
Every failure becomes a StorageError naming the bucket and the cause, with a HINT. Requests
are bounded by timeouts, so a store that stops answering fails a call, never hangs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainbox.errors import StorageError
from trainbox.storage.location import Location

# botocore logs request headers (the access key id among them) at DEBUG: never let `--debug`
# or a user's root logger turn that on.
for _name in ("boto3", "botocore", "s3transfer", "urllib3"):
    logging.getLogger(_name).setLevel(logging.WARNING)

# One DeleteObjects request takes at most this many keys (S3's limit).
_DELETE_BATCH = 1000
# Below this a file goes up in one request (faster than parts: benchmarks/README.md).
_ONE_REQUEST_BYTES = 64 << 20
# Parts of s3transfer's default size (8 MiB), the fastest measured; bigger only for a file
# that would otherwise need more than S3's cap of 10,000 parts (80 GB at 8 MiB).
_PART_BYTES = 8 << 20
_MAX_PARTS = 10_000
CREDENTIALS_HINT = (
    "check the store's credentials as the AWS CLI reads them (AWS_ACCESS_KEY_ID and"
    " AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the pod's Secret or IAM role) and that they may"
    " read, write and delete under the prefix"
)
ENDPOINT_HINT = (
    "check AWS_ENDPOINT_URL (for MinIO, Ceph or R2) and that this node can reach the store;"
    " without it boto3 talks to AWS S3 in AWS_DEFAULT_REGION"
)
_BUCKET_ERRORS = {"NoSuchBucket"}
_ACCESS_ERRORS = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "AllAccessDisabled", "403",
}  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """An object as a listing shows it."""

    # Its size in bytes.
    size: int
    # Its ETag, which changes whenever the object is written again.
    etag: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeouts:
    """How long the store may take before a call fails."""

    # Seconds to open a connection.
    connect_s: float
    # Seconds to wait for any answer on an open connection.
    read_s: float
    # Tries per request, the first included (botocore's standard retry mode).
    attempts: int


def run_timeouts(timeout_s: float) -> Timeouts:
    """A run's own calls (storage.timeout_s): a slow store gets time, a dead one fails the save."""
    return Timeouts(connect_s=min(10.0, timeout_s), read_s=timeout_s, attempts=3)


RUN = run_timeouts(60.0)


def probe_timeouts(timeout_s: float) -> Timeouts:
    """Preflight's probe, and files written on the way out: an answer within 60 s whatever the
    store does (2 tries of at most 5 s to connect and 10 s to answer), sooner if storage.timeout_s
    is shorter."""
    return Timeouts(connect_s=min(5.0, timeout_s), read_s=min(10.0, timeout_s), attempts=2)


PROBE = probe_timeouts(60.0)


class Store:
    """One location's objects, addressed by paths relative to it (`checkpoints/step-...pt`)."""

    def __init__(self, location: Location, *, timeouts: Timeouts = RUN) -> None:
        self.location = location
        self.timeouts = timeouts
        # Requests sent, by operation name: what a test counts per rank.
        self.requests: Counter[str] = Counter()
        self._client_lock = threading.Lock()
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The boto3 client, made on first use (importing boto3 costs ~0.3 s)."""
        with self._client_lock:
            if self._client is None:
                self._client = _make_client(self.timeouts, self.requests)
            return self._client

    def list(self, under: str = "") -> dict[str, Entry]:
        """Every object below `under` (relative), by relative path: one request per 1,000."""
        prefix = self.location.key(under) if under else self.location.key("")
        found: dict[str, Entry] = {}
        with self._failing(f"list {self._url(under)}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    entry = Entry(size=int(item["Size"]), etag=str(item["ETag"]))
                    found[self.location.relative(item["Key"])] = entry
        return found

    def upload(self, local: Path, relative: str) -> None:
        """Put a local file as one object; it appears whole or not at all (multipart if large)."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=_ONE_REQUEST_BYTES, multipart_chunksize=part_bytes(_size(local))
        )
        with self._failing(f"upload {local} to {self._url(relative)}"):
            self.client.upload_file(
                str(local), self.location.bucket, self.location.key(relative), Config=config
            )

    def put(self, relative: str, data: bytes) -> None:
        """Put a small object from memory."""
        with self._failing(f"write {self._url(relative)}"):
            self.client.put_object(
                Bucket=self.location.bucket, Key=self.location.key(relative), Body=data
            )

    def download(self, relative: str, local: Path) -> None:
        """Fetch one object into `local`, atomically: a partial download never has its name."""
        local.parent.mkdir(parents=True, exist_ok=True)
        temp = local.with_name(f".{local.name}.{os.getpid()}.{threading.get_ident()}.part")
        try:
            with self._failing(f"download {self._url(relative)}"):
                self.client.download_file(
                    self.location.bucket, self.location.key(relative), str(temp)
                )
            os.replace(temp, local)
        finally:
            with contextlib.suppress(OSError):
                temp.unlink()

    def delete(self, relatives: Iterable[str]) -> None:
        """Delete objects (absent ones are no error), 1,000 per request."""
        keys = [self.location.key(relative) for relative in relatives]
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start : start + _DELETE_BATCH]]
            with self._failing(f"delete old objects under {self.location.url}"):
                answer = self.client.delete_objects(
                    Bucket=self.location.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            if errors := answer.get("Errors"):
                first = errors[0]
                raise failure(
                    f"delete {self._url(self.location.relative(first.get('Key', '')))}",
                    str(first.get("Code", "")),
                    str(first.get("Message", "")),
                    self.location,
                )

    def probe(self) -> None:
        """Write and delete a probe object under the prefix: StorageError says why that fails."""
        relative = f".trainbox-probe-{os.uname().nodename}-{os.getpid()}"
        self.put(relative, b"")
        self.delete([relative])

    def _url(self, relative: str) -> str:
        return self.location.child(relative).url if relative else self.location.url

    @contextlib.contextmanager
    def _failing(self, what: str) -> Any:
        """boto3's exceptions as one StorageError line naming `what`, the bucket and the cause."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as err:
            info = err.response.get("Error", {})
            code = str(info.get("Code") or err.response.get("ResponseMetadata", {}).get(
                "HTTPStatusCode", ""))  # fmt: skip
            raise failure(what, code, str(info.get("Message", "")), self.location) from err
        except S3UploadFailedError as err:
            raise failure(what, _code_in(str(err)), str(err), self.location) from err
        except BotoCoreError as err:
            raise failure(what, type(err).__name__, str(err), self.location) from err
        except OSError as err:
            raise StorageError(
                f"could not {what}: {err.strerror or err}",
                hint="check the local volume behind $TMPDIR, where the working copy lives",
            ) from err


def part_bytes(size: int) -> int:
    """The part size for a file of `size` bytes: 8 MiB, or whole MiB enough to stay within
    10,000 parts."""
    mib = 1 << 20
    needed = -(-size // _MAX_PARTS)  # the smallest part that fits, rounded up
    return max(_PART_BYTES, -(-needed // mib) * mib)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # the upload itself names the file and the reason
        return 0


def _code_in(text: str) -> str:
    """The error code boto3 folds into an S3UploadFailedError's text ('... (NoSuchBucket) ...')."""
    for code in (*_BUCKET_ERRORS, *_ACCESS_ERRORS):
        if f"({code})" in text:
            return code
    return "UploadFailed"


def failure(what: str, code: str, message: str, location: Location) -> StorageError:
    """The StorageError for one failed call, by the store's error code."""
    bucket = location.bucket
    if code in _BUCKET_ERRORS:
        return StorageError(
            f"could not {what}: bucket {bucket!r} does not exist",
            hint="create the bucket first, or fix run_dir's bucket name",
        )
    if code in _ACCESS_ERRORS:
        return StorageError(
            f"could not {what}: access to bucket {bucket!r} denied ({code})", hint=CREDENTIALS_HINT
        )
    if code == "NoCredentialsError":
        return StorageError(
            f"could not {what}: no credentials for bucket {bucket!r} were found",
            hint=CREDENTIALS_HINT,
        )
    if code in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                "ConnectionClosedError"):  # fmt: skip
        return StorageError(
            f"could not {what}: the store for bucket {bucket!r} does not answer ({code})",
            hint=ENDPOINT_HINT,
        )
    detail = f"{code}: {message}" if message else code
    return StorageError(
        f"could not {what} in bucket {bucket!r} ({detail})".splitlines()[0], hint=ENDPOINT_HINT
    )


def _make_client(timeouts: Timeouts, requests: Counter[str]) -> Any:
    import boto3
    from botocore.config import Config as BotoConfig

    config = BotoConfig(
        connect_timeout=timeouts.connect_s,
        read_timeout=timeouts.read_s,
        retries={"max_attempts": timeouts.attempts, "mode": "standard"},
        # Path-style addressing works with every S3-compatible server (MinIO, Ceph, moto);
        # AWS S3 still serves it.
        s3={"addressing_style": "path"},
    )
    client = boto3.session.Session().client("s3", config=config)

    def count(event_name: str, **_: object) -> None:
        requests[event_name.rsplit(".", 1)[-1]] += 1

    client.meta.events.register("before-send.s3.*", count)
    return client


def summary(requests: Mapping[str, int]) -> dict[str, int]:
    """Requests by operation, and their total, for a log line."""
    return {**dict(sorted(requests.items())), "total": sum(requests.values())}
