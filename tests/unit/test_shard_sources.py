"""Shards and manifests read where they live: a path, an http(s) URL (a real ThreadingHTTPServer
on loopback) or a pipe: command, with the same samples as from the path and one line naming the
shard when a location fails."""

from __future__ import annotations

import json
import re
import shlex
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from trainbox.errors import UsageError
from trainbox.streams import plan
from trainbox.streams.dataset import PlannedReader, StreamBatch
from trainbox.streams.shards import (
    Cursor,
    Shard,
    ShardFault,
    missing_or_short,
    read_manifest,
    write_shards,
)
from trainbox.streams.sources import kind_of, resolve
from trainbox.tasks import shards as shard_task
from trainbox.train.data.contract import check_fit, spread

from stream_shards import numbered

# Every sample of a 7-sample set in 3 shards, with going back within a shard and across.
READS = [(0, 0), (0, 1), (0, 2), (0, 1), (1, 0), (1, 2), (2, 0), (0, 0), (1, 1), (1, 0)]


class Files(BaseHTTPRequestHandler):
    """Serves the server's folder under /plain/ (no ranges, as http.server does), /ranged/
    (honours `Range: bytes=A-B` with a 206, as S3 and GCS do) and /cut/ (sends half of the
    bytes its Content-Length promises, then hangs up)."""

    server: Served

    def do_GET(self) -> None:
        self.server.requested.append(self.path)
        mode, _, rest = self.path.lstrip("/").partition("/")
        file = self.server.root / rest
        if mode not in ("plain", "ranged", "cut") or not file.is_file():
            self.send_error(404)
            return
        data = file.read_bytes()
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        if mode == "ranged" and wanted:
            first, last = int(wanted[1]), min(int(wanted[2]), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            body = data[first : last + 1]
        else:
            self.send_response(200)
            body = data
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if mode == "cut" else body)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test's output is its assertions."""


class Served(ThreadingHTTPServer):
    """A ThreadingHTTPServer of a folder."""

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), Files)
        self.root = root
        # The path of every GET, in the order they came.
        self.requested: list[str] = []


@dataclass(frozen=True, kw_only=True)
class Site:
    """A folder of shards and the URL it is served at."""

    # The folder on disk.
    root: Path
    # http://127.0.0.1:PORT, without a trailing slash.
    base: str
    # The server, whose `requested` lists the GETs it answered.
    server: Served

    def url(self, mode: str, relative: str) -> str:
        return f"{self.base}/{mode}/{relative}"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    """7 samples in 3 shards under tmp_path/set, served on a loopback port the kernel picks."""
    write_shards(tmp_path / "set", numbered(7), per_shard=3)
    server = Served(tmp_path)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield Site(
            root=tmp_path, base=f"http://127.0.0.1:{server.server_address[1]}", server=server
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    ("location", "kind"),
    [
        ("/data/train/shard-000001.tar", "path"),
        ("train/shard-000001.tar", "path"),
        ("http://host/train/shard-000001.tar", "http"),
        ("HTTPS://bucket.s3.amazonaws.com/k.tar?X-Amz-Signature=ab", "http"),
        ("pipe:aws s3 cp s3://bucket/shard-000001.tar -", "pipe"),
        ("pipe:gcloud storage cat gs://bucket/shard-000001.tar", "pipe"),
        ("s3://bucket/shard-000001.tar", "unknown"),
        ("gs://bucket/shard-000001.tar", "unknown"),
        ("file:///data/shard-000001.tar", "unknown"),
    ],
)
def test_a_location_is_read_as_the_kind_its_string_names(location: str, kind: str) -> None:
    assert kind_of(location) == kind


@pytest.mark.parametrize(
    ("manifest", "entry", "resolved"),
    [
        ("/data/train/manifest.json", "shard-0.tar", "/data/train/shard-0.tar"),
        ("/data/train/manifest.json", "/elsewhere/shard-0.tar", "/elsewhere/shard-0.tar"),
        ("http://h/train/manifest.json", "shard-0.tar", "http://h/train/shard-0.tar"),
        ("http://h/train/manifest.json", "../other/shard-0.tar", "http://h/other/shard-0.tar"),
        ("http://h/train/manifest.json?sig=1", "shard-0.tar", "http://h/train/shard-0.tar"),
        ("/data/manifest.json", "https://o/shard-0.tar?sig=1", "https://o/shard-0.tar?sig=1"),
        ("http://h/manifest.json", "pipe:cat /d/shard-0.tar", "pipe:cat /d/shard-0.tar"),
        ("pipe:cat /d/manifest.json", "/d/shard-0.tar", "/d/shard-0.tar"),
        ("pipe:cat /d/manifest.json", "shard-0.tar", None),
    ],
)
def test_a_manifest_entry_resolves_against_the_manifests_own_location(
    manifest: str, entry: str, resolved: str | None
) -> None:
    assert resolve(manifest, entry) == resolved


@pytest.mark.parametrize("where", ["set/manifest.json", "set/"])
def test_a_manifest_read_by_url_lists_its_shards_by_url(site: Site, where: str) -> None:
    manifest = read_manifest(site.url("plain", where), key="data.args.train")
    assert manifest.counts == read_manifest(site.root / "set", key="k").counts
    assert [s.location for s in manifest.shards] == [
        site.url("plain", f"set/shard-{n:06d}.tar") for n in range(3)
    ]


def test_a_manifest_that_cannot_be_fetched_is_one_line_naming_the_url(site: Site) -> None:
    url = site.url("plain", "absent/manifest.json")
    with pytest.raises(UsageError) as caught:
        read_manifest(url, key="data.args.train")
    assert f"data.args.train: cannot read {url} (SourceError: HTTP 404" in caught.value.line()


def test_a_manifest_entry_trainbox_cannot_read_is_named_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    entries = [{"path": "s3://b/shard-0.tar", "samples": 1, "bytes": 10}]
    path.write_text(json.dumps({"format": "trainbox-shards/1", "shards": entries}))
    with pytest.raises(UsageError) as caught:
        read_manifest(path, key="data.args.train")
    assert "shard 0 is 's3://b/shard-0.tar', not a path" in caught.value.line()
    assert "pipe:aws s3 cp" in caught.value.line()


def test_a_manifest_at_an_unknown_scheme_is_refused_with_a_hint() -> None:
    with pytest.raises(UsageError) as caught:
        read_manifest("s3://b/train/manifest.json", key="data.args.train")
    line = caught.value.line()
    assert line.startswith("data.args.train: cannot read s3://b/train/manifest.json (SourceError")
    assert "pipe:aws s3 cp" in line


def test_a_manifest_from_a_pipe_lists_absolute_shards_and_refuses_relative_ones(
    site: Site,
) -> None:
    folder = site.root / "set"
    raw = json.loads((folder / "manifest.json").read_text())
    raw["shards"][0]["path"] = str(folder / raw["shards"][0]["path"])
    (folder / "absolute.json").write_text(json.dumps(raw))
    with pytest.raises(UsageError) as caught:
        read_manifest(f"pipe:cat {folder / 'absolute.json'}", key="data.args.train")
    assert caught.value.line().count("a pipe: manifest needs absolute paths or URLs") == 2
    raw["shards"] = raw["shards"][:1]
    (folder / "one.json").write_text(json.dumps(raw))
    manifest = read_manifest(f"pipe:cat {folder / 'one.json'}", key="data.args.train")
    assert [s.location for s in manifest.shards] == [str(folder / "shard-000000.tar")]


def elsewhere(shard: Shard, how: str, site: Site) -> Shard:
    """The same shard, read by URL or through `pipe:cat`."""
    name = Path(shard.location).name
    location = {
        "plain": site.url("plain", f"set/{name}"),
        "ranged": site.url("ranged", f"set/{name}"),
        "pipe": f"pipe:cat {shlex.quote(shard.location)}",
    }[how]
    return Shard(location=location, samples=shard.samples, size=shard.size)


@pytest.mark.parametrize("how", ["plain", "pipe"])
def test_a_streamed_shard_gives_the_same_samples_as_its_path_also_going_back(
    site: Site, how: str
) -> None:
    shards = read_manifest(site.root / "set", key="k").shards
    by_path, streamed = Cursor(), Cursor()
    try:
        for shard, member in READS:
            want = by_path.read(shards[shard], member)
            assert streamed.read(elsewhere(shards[shard], how, site), member) == want
    finally:
        by_path.close()
        streamed.close()


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("plain", "SourceError: HTTP 404"),
        ("cut", "SourceError: the server sent"),
    ],
)
def test_a_url_that_fails_is_named_with_the_sample(site: Site, mode: str, says: str) -> None:
    shard = read_manifest(site.root / "set", key="k").shards[1]
    if mode == "plain":
        Path(shard.location).unlink()
    broken = elsewhere(shard, "plain", site)
    broken = Shard(location=broken.location.replace("/plain/", f"/{mode}/"), samples=3, size=1)
    with pytest.raises(ShardFault) as caught:
        Cursor().read(broken, 2)
    assert caught.value.line.startswith(f"shard {broken.location} sample 2: {says}")


def test_a_server_that_never_answers_times_out_as_a_fault() -> None:
    # A listening socket that never accepts: the connection is made, no answer ever comes.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/shard.tar"
        with pytest.raises(ShardFault) as caught:
            Cursor(timeout=0.2).read(Shard(location=url, samples=1, size=1), 0)
    assert caught.value.line == f"shard {url} sample 0: SourceError: no answer in 0.2 s"


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("false", "the command exited with 1"),
        ("no-such-command-here", "the command exited with 127: .*no-such-command-here.*"),
        (
            "echo first >&2; echo access denied >&2; exit 3",
            "the command exited with 3: access denied",
        ),
        ("sleep 30", "the command wrote nothing for 0.2 s"),
    ],
)
def test_a_pipe_command_that_fails_is_named_with_its_last_error_line(
    command: str, says: str
) -> None:
    shard = Shard(location=f"pipe:{command}", samples=1, size=1)
    with pytest.raises(ShardFault) as caught:
        Cursor(timeout=0.2).read(shard, 0)
    assert re.fullmatch(
        f"shard {re.escape(shard.location)} sample 0: SourceError: {says}", caught.value.line
    )


@pytest.mark.parametrize("mode", ["plain", "ranged"])
def test_start_up_asks_each_url_for_its_size_and_skips_pipes(site: Site, mode: str) -> None:
    shards = read_manifest(site.root / "set", key="k").shards
    Path(shards[0].location).write_bytes(Path(shards[0].location).read_bytes()[:700])
    Path(shards[1].location).unlink()
    pipe = Shard(location="pipe:cat /nowhere", samples=1, size=1)
    served = [elsewhere(shard, mode, site) for shard in shards]
    assert missing_or_short([*served, pipe]) == [
        f"shard {served[0].location} is 700 bytes, not the {shards[0].size} written",
        f"shard {served[1].location} cannot be read (HTTP 404 Not Found)",
    ]


def test_the_data_factory_trains_from_a_url_manifest_as_from_its_path(site: Site) -> None:
    by_url = shard_task.data(train=site.url("plain", "set/"), shuffle_buffer=3).train
    by_path = shard_task.data(train=str(site.root / "set"), shuffle_buffer=3).train
    epoch_plan = plan.first_plan(
        seed=3, epoch=1, total=7, world_size=2, batch_size=2, lanes=1, window=3
    )
    for rank in range(2):
        keys = [(epoch_plan.epoch, batch) for batch in range(epoch_plan.per_rank)]
        from_url, from_path = (PlannedReader(s, epoch_plan, rank=rank) for s in (by_url, by_path))
        got, want = [from_url[key] for key in keys], [from_path[key] for key in keys]
        assert all(isinstance(batch, StreamBatch) for batch in got)
        assert [b.batch[0].tolist() for b in got] == [b.batch[0].tolist() for b in want]  # type: ignore[union-attr]


def test_a_start_up_check_reads_a_url_sets_first_samples_and_a_path_sets_spread(
    site: Site,
) -> None:
    by_url = shard_task.data(train=site.url("plain", "set/")).train
    by_path = shard_task.data(train=str(site.root / "set")).train
    assert spread(by_url, 3) == [0, 1, 2]
    assert spread(by_path, 3) == [0, 2, 4, 6]


def test_the_fit_check_of_a_url_set_opens_only_the_shards_its_first_samples_fill(
    site: Site,
) -> None:
    write_shards(site.root / "big", numbered(400), per_shard=50)
    data = shard_task.data(train=site.url("plain", "big/"))
    site.server.requested.clear()
    check_fit(torch.nn.Linear(2, 3), data, loss=torch.nn.functional.cross_entropy)
    # 64 samples: all of shard 0 and 14 of shard 1, one GET each; a spread would open all 8.
    assert site.server.requested == ["/plain/big/shard-000000.tar", "/plain/big/shard-000001.tar"]
