"""Where a manifest or shard lives (a path, an http(s) URL or a `pipe:COMMAND` whose output is
the file) and the one place that opens it, reads it front to back or asks its size."""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import re
import select
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal
from urllib.parse import urljoin

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

# Seconds a network read or a pipe command may go without a byte before it counts as failed.
TIMEOUT = 60.0
PIPE = "pipe:"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

Kind = Literal["path", "http", "pipe", "unknown"]
# What to do with a location of an unknown kind.
UNKNOWN = (
    "not a path, an http(s):// URL or pipe:COMMAND (read s3:// or gs:// through"
    " pipe:aws s3 cp URL - or pipe:gcloud storage cat URL, or a presigned https URL)"
)


class SourceError(OSError):
    """A location that cannot be opened or read to its end; the message says why."""


def kind_of(location: str) -> Kind:
    """How `location` is read: a file path, an http(s) URL, a pipe: command, or an unknown
    scheme (s3://, gs://...) that trainbox does not read itself."""
    if location.startswith(PIPE):
        return "pipe"
    scheme = _SCHEME.match(location)
    if scheme is None:
        return "path"
    return "http" if scheme.group(1).lower() in ("http", "https") else "unknown"


def resolve(base: str, entry: str) -> str | None:
    """Where a manifest at `base` says `entry` is: a URL or pipe: entry as it stands, a path
    relative to the manifest's folder or URL; None when a pipe: manifest lists a relative one."""
    if kind_of(entry) != "path":
        return entry
    kind = kind_of(base)
    if kind == "http":
        return urljoin(base, entry)
    if kind == "pipe":
        return entry if Path(entry).is_absolute() else None
    return str(Path(base).parent / entry)


def open_stream(location: str, *, timeout: float = TIMEOUT) -> IO[bytes]:
    """`location` opened to read front to back; SourceError when it cannot be, or when a read
    fails, stalls `timeout` seconds, or ends short of the size the server gave."""
    kind = kind_of(location)
    if kind == "http":
        return io.BufferedReader(_HttpReader(location, timeout=timeout))
    if kind == "pipe":
        return io.BufferedReader(_PipeReader(location[len(PIPE) :], timeout=timeout))
    if kind == "unknown":
        raise SourceError(f"{location} is {UNKNOWN}")
    return open(location, "rb")


def read_all(location: str, *, timeout: float = TIMEOUT) -> bytes:
    """The whole of `location` (SourceError or OSError when it cannot be read)."""
    with open_stream(location, timeout=timeout) as stream:
        return stream.read()


def size_of(location: str, *, timeout: float = TIMEOUT) -> int | None:
    """Its size in bytes, from one stat or one request; None for a pipe: command, whose output
    is known only by running it. OSError when it cannot be read."""
    kind = kind_of(location)
    if kind == "pipe":
        return None
    if kind != "http":
        return Path(location).stat().st_size
    # A GET of the first byte, not a HEAD: a presigned S3 or GCS URL is signed for GET only.
    request = urllib.request.Request(location, headers={"Range": "bytes=0-0"})
    with _urlopen(request, timeout=timeout) as response:
        whole = (response.headers.get("Content-Range") or "").rpartition("/")[2]
        length = whole if response.status == 206 else response.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise SourceError(f"HTTP {response.status} gave no size")
        return int(length)


def _urlopen(request: urllib.request.Request, *, timeout: float) -> http.client.HTTPResponse:
    """The response to `request`; SourceError with the status or the connection's failure."""
    try:
        response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        err.close()
        raise SourceError(f"HTTP {err.code} {err.reason}") from err
    except urllib.error.URLError as err:
        raise SourceError(f"cannot connect ({err.reason})") from err
    except TimeoutError as err:
        raise SourceError(f"no answer in {timeout:g} s") from err
    except (OSError, http.client.HTTPException) as err:
        raise SourceError(f"{type(err).__name__}: {err}") from err
    return response


class _HttpReader(io.RawIOBase):
    """An http(s) GET's body, failing when the server sends fewer bytes than it said."""

    def __init__(self, url: str, *, timeout: float) -> None:
        self._timeout = timeout
        self._response = _urlopen(urllib.request.Request(url), timeout=timeout)
        length = self._response.headers.get("Content-Length")
        self._length = int(length) if length and length.isdigit() else None
        self._got = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        try:
            count = self._response.readinto(view)
        except TimeoutError as err:
            raise SourceError(f"no data for {self._timeout:g} s") from err
        except (OSError, http.client.HTTPException) as err:
            raise SourceError(f"{type(err).__name__}: {err}") from err
        self._got += count
        if count == 0 and len(view) and self._length is not None and self._got < self._length:
            raise SourceError(f"the server sent {self._got} of {self._length} bytes")
        return count

    def close(self) -> None:
        if not self.closed:
            self._response.close()
        super().close()


class _PipeReader(io.RawIOBase):
    """A shell command's standard output; its end fails when the command exits non-zero."""

    def __init__(self, command: str, *, timeout: float) -> None:
        self._timeout = timeout
        # A file, not a pipe: a command writing much to stderr must never block on it.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        try:
            # Its own session, so that closing early ends the command's children too.
            self._process = subprocess.Popen(
                command,
                shell=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,
            )
        except OSError:
            self._stderr.close()
            raise
        assert self._process.stdout is not None  # stdout=PIPE gives one
        self._fd = self._process.stdout.fileno()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        ready, _, _ = select.select([self._fd], [], [], self._timeout)
        if not ready:
            raise SourceError(f"the command wrote nothing for {self._timeout:g} s")
        data = os.read(self._fd, len(view))
        view[: len(data)] = data
        if not data and len(view):
            self._check_exit()
        return len(data)

    def _check_exit(self) -> None:
        try:
            code = self._process.wait(timeout=self._timeout)
        except subprocess.TimeoutExpired as err:
            raise SourceError("the command did not exit after its output") from err
        if code != 0:
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").strip().splitlines()
            said = f": {lines[-1].strip()}" if lines else ""
            raise SourceError(f"the command exited with {code}{said}")

    def close(self) -> None:
        if not self.closed:
            if self._process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
            assert self._process.stdout is not None
            self._process.stdout.close()
            self._stderr.close()
        super().close()
