"""A real S3-compatible server on loopback for the tests: moto's server (what s3fs's own suite
runs against), started as a process of its own on a port the kernel picks.

A process, not moto's in-process mock: trainbox's ranks are other processes (torchrun, srun,
podman pods) that reach it over HTTP, exactly as they reach a store in the cloud; and a process
can be frozen (SIGSTOP) to play a store that stops answering mid-save.

    with S3Server.start() as server:
        server.make_bucket("runs")
        subprocess.run([...], env={**os.environ, **server.env})   # AWS_ENDPOINT_URL and keys
        server.keys("runs", "run1/")                                # what landed, with sizes
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# moto accepts any keys; these are what its docs use. Region: botocore needs one to sign.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_RUNNING = re.compile(rb"Running on http://[\d.]+:(\d+)")
# moto's server imports its whole service catalogue first: seconds on a busy 2-CPU machine.
_START_TIMEOUT_S = 60.0


@dataclass
class S3Server:
    """A moto server process and how to reach it."""

    # The server process (its output is drained into a file so that it never blocks).
    process: subprocess.Popen[bytes]
    # http://HOST:PORT, what AWS_ENDPOINT_URL names.
    endpoint: str
    # The host the server listens on.
    host: str

    @classmethod
    @contextlib.contextmanager
    def start(
        cls, *, host: str = "127.0.0.1", log: Any = None, check_keys: bool = False
    ) -> Iterator[S3Server]:
        """Start a server listening on `host` at a free port; stopped (and reaped) on exit.

        `check_keys`: refuse every request whose keys moto's IAM does not hold (all of them),
        as a store refuses wrong credentials. Otherwise moto takes any keys.
        """
        auth = {"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if check_keys else {}
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **auth},
        )
        try:
            port = _wait_for_port(process)
            server = cls(process=process, endpoint=f"http://{host}:{port}", host=host)
            _drain(process, log)
            yield server
        finally:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    @property
    def env(self) -> dict[str, str]:
        """The variables a process needs to use this server as its store (as the AWS CLI reads them)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self) -> Any:
        """A boto3 S3 client of this server."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )

    def make_bucket(self, name: str) -> str:
        """Create a bucket; its name."""
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object under `prefix`: {key: size}."""
        found: dict[str, int] = {}
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        for page in pages:
            found.update({item["Key"]: item["Size"] for item in page.get("Contents", [])})
        return found

    def read(self, bucket: str, key: str) -> bytes:
        """One object's bytes."""
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def freeze(self) -> None:
        """Stop answering (SIGSTOP): connections are accepted by the kernel, never served."""
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Answer again."""
        self.process.send_signal(signal.SIGCONT)


def _wait_for_port(process: subprocess.Popen[bytes]) -> int:
    assert process.stdout is not None
    deadline = time.monotonic() + _START_TIMEOUT_S
    seen = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=deadline - time.monotonic()):
                break
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
            if found := _RUNNING.search(seen):
                return int(found[1])
    raise RuntimeError(f"moto's server did not start: {seen.decode(errors='replace')[-2000:]}")


def _drain(process: subprocess.Popen[bytes], log: Any) -> None:
    """Keep reading the server's request log so that a full pipe never stalls it."""
    import threading

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if log is not None:
                log.write(line)

    threading.Thread(target=pump, name="moto-log", daemon=True).start()
