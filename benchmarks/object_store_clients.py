"""Three S3 clients on the same upload: boto3, s3fs and obstore, against one local S3 server.

    .venv/bin/python benchmarks/object_store_clients.py            # 256 MiB, 5 rounds
    .venv/bin/python benchmarks/object_store_clients.py --quick    # 16 MiB, 1 round (CI)
    /tmp/bench-all/bin/python benchmarks/object_store_clients.py   # in a venv with all three

Why: `run_dir=s3://BUCKET/PREFIX` uploads checkpoints with boto3; this is the measurement
behind that choice (docs/storage.md, "Why boto3"). It needs neither torch nor trainbox: any
interpreter with moto[server] and one or more of the clients runs it. A client that does not
import here is reported as "not installed here".

One moto server process (tests/s3server.py) on loopback, one file of random bytes. Each round
uploads the file once with every client, in turn (boto3 s3fs obstore boto3 ...), each with its
own bulk upload and its defaults:

* boto3: `client.upload_file` (s3transfer, default TransferConfig: 8 MiB parts, 10 threads).
* s3fs: `S3FileSystem.put_file` (50 MiB parts, 10 at a time).
* obstore: `obstore.put` of the file's Path on an `S3Store` (5 MiB parts, 12 at a time).

`--parts-mib N` makes all three use multipart uploads with N MiB parts instead (concurrency
stays each one's default), which separates the part size from the library.

Reported: median MB/s per client, its ratio to boto3's, and the CPU seconds per upload of the
uploading process (all its threads) and of the server. The server is the same Python process
for all three and shares the two CPUs with the client, so these are figures for this set-up,
not for S3. Each object's size is checked after its upload, and its bytes once per client.

Then the half-written case, once per client: a child process uploads a larger file
(`--kill-mib`, multipart forced: 8 MiB parts for all three) through a relay on loopback that
lets `--kill-at` of the file's size through toward the server and then holds the connections,
so the upload can never finish; the child is then killed with SIGKILL. After that: does a
HEAD and a GET of the key, through the same client, find an object? How many incomplete
multipart uploads does the server list for the key (ListMultipartUploads), with how many parts
stored? They are aborted afterwards. The kill comes at a fixed point in the byte stream, not
after a guessed sleep.

"others used N CPUs" in the progress lines counts the moto server too: it is not this
process's child until it exits.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness

CLIENTS = ("boto3", "s3fs", "obstore")
# Distributions whose versions the result names, where installed.
VERSIONS = ("boto3", "botocore", "s3transfer", "s3fs", "fsspec", "aiobotocore", "obstore", "moto")
MIB = 2**20
# Part size in the half-written case (boto3's default), for every client.
KILL_PART = 8 * MIB
BUCKET = "bench"
# The child's first argument: upload the file the half-written case gives it, then exit.
CHILD = "--child-upload"


@dataclass
class Client:
    """One library's upload and read-back of keys in one bucket."""

    name: str
    # Upload a local file to a key.
    upload: Callable[[Path, str], None]
    # (HEAD found the key, GET returned its bytes)
    visible: Callable[[str], tuple[bool, bool]]


def connect(name: str, endpoint: str, credentials: dict[str, str], *, part: int = 0) -> Client:
    """`name`'s client of BUCKET at `endpoint`; `part` > 0 forces multipart with parts of that
    many bytes (0: the library's defaults)."""
    key_id = credentials["AWS_ACCESS_KEY_ID"]
    secret = credentials["AWS_SECRET_ACCESS_KEY"]
    region = credentials["AWS_DEFAULT_REGION"]
    if name == "boto3":
        import boto3
        import botocore.exceptions
        from boto3.s3.transfer import TransferConfig

        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id,
                          aws_secret_access_key=secret, region_name=region)  # fmt: skip
        config = (
            TransferConfig(multipart_threshold=part, multipart_chunksize=part)
            if part
            else TransferConfig()
        )

        def boto3_visible(key: str) -> tuple[bool, bool]:
            found = []
            for call in (s3.head_object, s3.get_object):
                try:
                    response = call(Bucket=BUCKET, Key=key)
                    if "Body" in response:
                        response["Body"].read()
                    found.append(True)
                except botocore.exceptions.ClientError as error:
                    if error.response["Error"]["Code"] not in ("404", "NoSuchKey"):
                        raise
                    found.append(False)
            return found[0], found[1]

        return Client(
            name, lambda path, key: s3.upload_file(str(path), BUCKET, key, Config=config),
            boto3_visible,
        )  # fmt: skip
    if name == "s3fs":
        import s3fs

        fs = s3fs.S3FileSystem(key=key_id, secret=secret, endpoint_url=endpoint,
                               client_kwargs={"region_name": region})  # fmt: skip
        chunks = {"chunksize": part} if part else {}

        def s3fs_visible(key: str) -> tuple[bool, bool]:
            found = []
            fs.invalidate_cache()
            for call in (fs.info, fs.cat_file):
                try:
                    call(f"{BUCKET}/{key}")
                    found.append(True)
                except FileNotFoundError:
                    found.append(False)
            return found[0], found[1]

        return Client(
            name, lambda path, key: fs.put_file(str(path), f"{BUCKET}/{key}", **chunks),
            s3fs_visible,
        )  # fmt: skip
    if name == "obstore":
        import obstore
        from obstore.store import S3Store

        store = S3Store(BUCKET, endpoint=endpoint, access_key_id=key_id, secret_access_key=secret,
                        region=region, client_options={"allow_http": True})  # fmt: skip
        parts: dict[str, Any] = {"use_multipart": True, "chunk_size": part} if part else {}

        def obstore_visible(key: str) -> tuple[bool, bool]:
            found = []
            for call in (lambda: obstore.head(store, key), lambda: obstore.get(store, key).bytes()):
                try:
                    call()
                    found.append(True)
                except FileNotFoundError:
                    found.append(False)
            return found[0], found[1]

        return Client(
            name, lambda path, key: obstore.put(store, key, path, **parts),
            obstore_visible,
        )  # fmt: skip
    raise ValueError(f"unknown client {name}")


def installed(name: str) -> bool:
    """Whether `name` imports in this interpreter."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def random_file(path: Path, size: int) -> str:
    """Write `size` random bytes to `path`; their sha256."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for start in range(0, size, 16 * MIB):
            block = os.urandom(min(16 * MIB, size - start))
            digest.update(block)
            out.write(block)
    return digest.hexdigest()


def timed_upload(
    client: Client, path: Path, size: int, checker: Any, key: str, server_pid: int
) -> dict[str, Any]:
    """One upload: MB/s, this process's and the server's CPU seconds; the object is checked,
    then deleted."""
    cpu, server_cpu = harness.cpu_seconds(), harness.cpu_seconds(server_pid)
    started = time.perf_counter()
    client.upload(path, key)
    seconds = time.perf_counter() - started
    cpu = harness.cpu_seconds() - cpu
    server_cpu = harness.cpu_seconds(server_pid) - server_cpu
    stored = checker.head_object(Bucket=BUCKET, Key=key)["ContentLength"]
    if stored != size:
        raise RuntimeError(f"{client.name}: {key} has {stored} bytes, uploaded {size}")
    checker.delete_object(Bucket=BUCKET, Key=key)
    return {"seconds": seconds, "mb_per_s": size / 1e6 / seconds, "cpu_s": cpu,
            "server_cpu_s": server_cpu}  # fmt: skip


def same_bytes(client: Client, path: Path, digest: str, checker: Any) -> None:
    """Upload once, untimed, and compare what the server holds with the file (sha256)."""
    key = f"check-{client.name}"
    client.upload(path, key)
    body = checker.get_object(Bucket=BUCKET, Key=key)["Body"]
    stored = hashlib.sha256()
    while block := body.read(16 * MIB):
        stored.update(block)
    checker.delete_object(Bucket=BUCKET, Key=key)
    if stored.hexdigest() != digest:
        raise RuntimeError(f"{client.name}: the stored bytes differ from the file's")


class Relay:
    """A TCP relay on loopback to the server that lets `budget` bytes through toward it, then
    holds every connection: it stops reading from the client, so the upload cannot finish."""

    def __init__(self, target: tuple[str, int], budget: int) -> None:
        self.target = target
        self.budget = budget
        self.passed = 0
        self.spent = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return  # closed
            far = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [near, far]
            for source, sink, counted in ((near, far, True), (far, near, False)):
                threading.Thread(
                    target=self._pump, args=(source, sink, counted), daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(1 << 16):
                if counted:
                    with self._lock:
                        allowed = min(len(chunk), self.budget - self.passed)
                        self.passed += allowed
                    if allowed < len(chunk):
                        sink.sendall(chunk[:allowed])
                        self.spent.set()
                        return  # hold: nothing more from this client reaches the server
                sink.sendall(chunk)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def half_written(
    name: str, server: Any, credentials: dict[str, str], path: Path, fraction: float
) -> dict[str, Any]:
    """Kill -9 a child uploading `path` once `fraction` of its bytes went toward the server;
    what a reader and the server's multipart listing show afterwards."""
    host, port = server.endpoint.removeprefix("http://").rsplit(":", 1)
    size = path.stat().st_size
    relay = Relay((host, int(port)), int(size * fraction))
    key = f"half-{name}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | credentials
    child = subprocess.Popen(
        [sys.executable, __file__, CHILD, name, relay.endpoint, str(path), key],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not relay.spent.wait(0.05):
            if child.poll() is not None or time.monotonic() > deadline:
                break
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        _, stderr = child.communicate(timeout=30)
    finally:
        relay.close()
    if child.returncode == -signal.SIGKILL:
        fate = "killed"
    elif child.returncode == 0:
        fate = "finished first"
    else:
        raise RuntimeError(f"{name}'s upload exited {child.returncode}: {stderr.decode()[-2000:]}")
    reader = connect(name, server.endpoint, credentials)
    head, get = reader.visible(key)
    checker = server.client()
    uploads = checker.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", [])
    parts = 0
    for upload in uploads:
        listed = checker.list_parts(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])
        parts += len(listed.get("Parts", []))
        checker.abort_multipart_upload(
            Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
        )
    with contextlib.suppress(Exception):
        checker.delete_object(Bucket=BUCKET, Key=key)
    return {"child": fate, "bytes_through": relay.passed, "head_found": head, "get_found": get,
            "incomplete_uploads": len(uploads), "parts_stored": parts}  # fmt: skip


def child_upload(argv: list[str]) -> int:
    """In the child: NAME ENDPOINT FILE KEY, credentials from the environment."""
    name, endpoint, path, key = argv
    connect(name, endpoint, dict(os.environ), part=KILL_PART).upload(Path(path), key)
    return 0


@contextlib.contextmanager
def s3_server() -> Iterator[tuple[Any, dict[str, str]]]:
    """tests/s3server.py's moto server with BUCKET made; its credentials."""
    sys.path.insert(0, str(harness.ROOT / "tests"))
    from s3server import CREDENTIALS, S3Server

    with S3Server.start() as server:
        server.make_bucket(BUCKET)
        yield server, dict(CREDENTIALS)


def yes_no(found: bool) -> str:
    return "found" if found else "404"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        return child_upload(sys.argv[2:])
    parse = harness.parser(__doc__)
    parse.add_argument("--size-mib", type=int, default=0, help="upload size (0: 256, quick 16)")
    parse.add_argument(
        "--parts-mib",
        type=int,
        default=0,
        help="multipart with parts of this size for all (0: each one's defaults)",
    )
    parse.add_argument("--kill-mib", type=int, default=64, help="the half-written upload's size")
    parse.add_argument("--kill-at", type=float, default=0.4,
                       help="share of its bytes let through before the kill")  # fmt: skip
    args = parse.parse_args()
    bench = harness.start("object_store_clients", args, reps=5)
    size = (args.size_mib or (16 if args.quick else 256)) * MIB
    part = args.parts_mib * MIB
    present = [name for name in CLIENTS if installed(name)]
    if "boto3" not in present:
        raise SystemExit("boto3 is needed: moto's server and the checks use it")
    with harness.workdir("object-store") as work:
        source, big = work / "upload.bin", work / "half.bin"
        digest = random_file(source, size)
        random_file(big, args.kill_mib * MIB)
        with s3_server() as (server, credentials):
            checker = server.client()
            clients = [connect(n, server.endpoint, credentials, part=part) for n in present]
            for client in clients:  # untimed: imports, connections, and the bytes compared
                same_bytes(client, source, digest, checker)
            runs = bench.rounds(
                [(c.name, lambda c=c: timed_upload(c, source, size, checker, f"up-{c.name}",
                                                   server.process.pid))
                 for c in clients],
            )  # fmt: skip
            halves = {n: half_written(n, server, credentials, big, args.kill_at) for n in present}
    speeds = harness.column(runs, "mb_per_s")
    cpu, server_cpu = harness.column(runs, "cpu_s"), harness.column(runs, "server_cpu_s")
    found = versions()
    rows: list[list[Any]] = [["client", "version", "MB/s (median)", "/ boto3", "client CPU s",
                              "server CPU s", "runs (MB/s)"]]  # fmt: skip
    for name in CLIENTS:
        if name not in speeds:
            rows.append([name, "not installed here", "", "", "", "", ""])
            continue
        rows.append([name, found[name], harness.median(speeds[name]),
                     harness.ratio(speeds[name], speeds["boto3"]), harness.median(cpu[name]),
                     harness.median(server_cpu[name]),
                     harness.spread(speeds[name])])  # fmt: skip
    parts = f"{args.parts_mib} MiB parts for all" if part else "each library's default parts"
    print(f"upload of {size // MIB} MiB to moto {found.get('moto', '?')} on loopback, {parts},"
          f" {bench.reps} round(s), clients in turn")  # fmt: skip
    print(harness.table(rows))
    print(f"\nkilled -9 once {args.kill_at:.0%} of a {args.kill_mib} MiB upload"
          f" ({KILL_PART // MIB} MiB parts) had gone toward the server")  # fmt: skip
    rows = [["client", "child", "HEAD", "GET", "incomplete uploads left", "parts stored"]]
    for name in CLIENTS:
        if name not in halves:
            rows.append([name, "not installed here", "", "", "", ""])
            continue
        half = halves[name]
        rows.append([name, half["child"], yes_no(half["head_found"]), yes_no(half["get_found"]),
                     half["incomplete_uploads"], half["parts_stored"]])  # fmt: skip
    print(harness.table(rows))
    settings = {"size_bytes": size, "reps": bench.reps, "kill_bytes": args.kill_mib * MIB,
                "part_bytes": part, "kill_at": args.kill_at,
                "kill_part_bytes": KILL_PART}  # fmt: skip
    return bench.finish(
        {
            "settings": settings,
            "versions": found,
            "not_installed": [name for name in CLIENTS if name not in present],
            "mb_per_s": speeds,
            "median_mb_per_s": {name: harness.median(v) for name, v in speeds.items()},
            "ratio_to_boto3": {
                name: harness.ratio(v, speeds["boto3"]) for name, v in speeds.items()
            },
            "client_cpu_s": cpu,
            "server_cpu_s": server_cpu,
            "half_written": halves,
        },
        positive=[v for values in speeds.values() for v in values],
    )


if __name__ == "__main__":
    raise SystemExit(main())
