"""run_dir=s3://: which URLs are served, what counts as a complete checkpoint in a listing, what
a prune deletes and in which order, and which files each rank fetches. Pure functions, no store."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox import config
from trainbox.errors import StorageError
from trainbox.storage import location, reading
from trainbox.storage.location import Location
from trainbox.storage.mirror import complete_checkpoints, snapshot_of, stale
from trainbox.storage.store import Entry, part_bytes, probe_timeouts
from trainbox.storage.store import failure as store_error
from trainbox.storage.uploads import Uploads


@pytest.mark.parametrize(
    ("text", "bucket", "prefix"),
    [
        ("s3://runs/team/run1", "runs", "team/run1"),
        ("s3://runs/team/run1/", "runs", "team/run1"),
        ("s3://runs", "runs", ""),
        ("s3://my.bucket-2/a//b", "my.bucket-2", "a/b"),
    ],
)
def test_an_s3_url_names_a_bucket_and_prefix(text: str, bucket: str, prefix: str) -> None:
    assert location.problems(text) == []
    assert location.parse(text) == Location(bucket=bucket, prefix=prefix)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("hdfs://nn/runs", "hdfs:// is not a store trainbox can use"),
        ("gs://bucket/run", "gs:// is not a store trainbox can use"),
        ("file:///tmp/run", "file:// is not a store trainbox can use"),
        # The typos that used to become a local folder named `s3:`.
        ("s3:/runs/run1", "is not a well-formed URL"),
        ("s3:runs/run1", "is not a well-formed URL"),
        ("S3://runs/run1", "is not a well-formed URL"),
        ("s3://Runs_1/run1", "names no valid bucket"),
        ("s3://ab/run1", "names no valid bucket"),
        ("s3://runs/../other", "has '.' or '..' in its prefix"),
    ],
)
def test_urls_trainbox_cannot_use_are_named(text: str, problem: str) -> None:
    (found,) = location.problems(text)
    assert found.startswith(f"run_dir={text!r}")
    assert problem in found


@pytest.mark.parametrize("text", ["runs/a:b", "/data/runs/x", "s3-like/run", "./s3:/x", "c:/x"])
def test_paths_that_only_look_like_urls_stay_paths(text: str) -> None:
    assert location.problems(text) == []
    assert location.parse(text) is None
    assert config.load(None, [f"run_dir={text}"]).output_dir == Path(text)


def test_an_s3_run_dir_works_in_a_copy_under_tmpdir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", "/scratch/job7")
    loaded = config.load(None, ["run_dir=s3://runs/team/run1"])
    assert loaded.store == Location(bucket="runs", prefix="team/run1")
    assert loaded.output_dir == Path("/scratch/job7/trainbox-store/runs/team/run1")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("run_dir", "hdfs://nn/runs"),
        ("run_dir", "s3:/runs/run1"),
        ("train.init_from", "gs://bucket/run/checkpoints/latest"),
        ("train.resume", "s3:runs/run1/checkpoints/step-00000010.pt"),
    ],
)
def test_a_url_trainbox_cannot_use_is_a_config_error_with_the_url_hint(
    key: str, value: str
) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.load(None, [f"{key}={value}"])
    (problem,) = caught.value.problems
    assert problem.startswith(f"{key}={value!r}")
    assert caught.value.hint == location.URL_HINT


def entries(*keys: str) -> dict[str, Entry]:
    return {key: Entry(size=len(key), etag=f'"{key}"') for key in keys}


ONE_FILE = entries(
    "config.yaml", "metrics.jsonl", "summary.json", "hang/rank-00001.txt",
    "checkpoints/step-00000010.pt", "checkpoints/step-00000010.pt.sha256",
    "checkpoints/step-00000020.pt", "checkpoints/step-00000020.pt.sha256",
    "checkpoints/step-00000030.pt", "checkpoints/step-00000030.pt.sha256",
    # Killed between the file and its marker: never taken, and pruned once older than a kept one.
    "checkpoints/step-00000040.pt",
)  # fmt: skip
SHARDED = entries(
    *(f"checkpoints/step-00000010.dcp/{name}" for name in
      ("__0_0.distcp", "__1_0.distcp", "__2_0.distcp", ".metadata", "record.pt", "manifest.json")),
    # Every shard but no manifest yet: incomplete.
    *(f"checkpoints/step-00000020.dcp/{name}" for name in
      ("__0_0.distcp", "__1_0.distcp", "__2_0.distcp", ".metadata", "record.pt")),
)  # fmt: skip


def test_a_one_file_checkpoint_counts_once_its_sidecar_is_stored() -> None:
    complete = complete_checkpoints(ONE_FILE)
    assert list(complete) == [f"checkpoints/step-000000{n}0.pt" for n in (1, 2, 3)]
    assert set(complete["checkpoints/step-00000030.pt"]) == {
        "checkpoints/step-00000030.pt", "checkpoints/step-00000030.pt.sha256",
    }  # fmt: skip


def test_a_sharded_checkpoint_counts_once_its_manifest_is_stored() -> None:
    complete = complete_checkpoints(SHARDED)
    assert list(complete) == ["checkpoints/step-00000010.dcp"]
    assert len(complete["checkpoints/step-00000010.dcp"]) == 6


def test_a_snapshot_holds_the_run_files_and_the_newest_complete_checkpoint() -> None:
    found = snapshot_of(ONE_FILE)
    assert found.checkpoint == "checkpoints/step-00000030.pt"
    assert set(found.run_files) == {
        "config.yaml", "metrics.jsonl", "summary.json", "hang/rank-00001.txt",
    }  # fmt: skip


def test_a_sidecar_alone_is_no_checkpoint() -> None:
    assert complete_checkpoints(entries("checkpoints/step-00000050.pt.sha256")) == {}


def test_a_prune_keeps_the_newest_complete_and_deletes_markers_first() -> None:
    doomed = stale(ONE_FILE, keep_last=2)
    assert doomed == ["checkpoints/step-00000010.pt.sha256", "checkpoints/step-00000010.pt"]


def test_a_prune_leaves_an_upload_newer_than_every_complete_checkpoint() -> None:
    # step 40 has no marker: the upload of it may still be under way.
    assert "checkpoints/step-00000040.pt" not in stale(ONE_FILE, keep_last=1)


def test_a_prune_deletes_an_incomplete_upload_older_than_a_complete_one() -> None:
    listing = {**ONE_FILE, **entries("checkpoints/step-00000025.pt")}
    assert "checkpoints/step-00000025.pt" in stale(listing, keep_last=3)


def test_a_sharded_prune_deletes_the_manifest_before_the_shards() -> None:
    newer = {key.replace("00000010", "00000030"): e for key, e in SHARDED.items()
             if "00000010" in key}  # fmt: skip
    doomed = stale({**SHARDED, **newer}, keep_last=1)
    assert doomed[0] == "checkpoints/step-00000010.dcp/manifest.json"
    # Step 10 whole, and step 20's incomplete upload, older than the kept step 30.
    assert {key.split("/")[1] for key in doomed} == {"step-00000010.dcp", "step-00000020.dcp"}
    assert len(doomed) == 11


@pytest.mark.parametrize(
    ("rank", "world_size", "shards"),
    [(0, 3, {"__0_0.distcp"}), (1, 3, {"__1_0.distcp"}), (2, 3, {"__2_0.distcp"})],
)
def test_each_rank_fetches_its_own_shards_and_its_share_of_the_check(
    rank: int, world_size: int, shards: set[str]
) -> None:
    found = snapshot_of(SHARDED).sharded_share(rank, world_size)
    names = {key.rsplit("/", 1)[1] for key in found}
    listed = sorted(
        key.rsplit("/", 1)[1] for key in SHARDED
        if key.startswith("checkpoints/step-00000010.dcp/") and not key.endswith("manifest.json")
    )  # fmt: skip
    assert names == {"manifest.json", ".metadata", "record.pt", *shards, *listed[rank::world_size]}


def test_a_rank_of_a_bigger_job_fetches_only_the_index_and_its_check_share() -> None:
    found = snapshot_of(SHARDED).sharded_share(7, 8)
    assert {key.rsplit("/", 1)[1] for key in found} == {"manifest.json", ".metadata", "record.pt"}


@pytest.mark.parametrize(
    ("url", "root", "inside"),
    [
        ("s3://runs/exp1", "exp1", ""),
        ("s3://runs/team/exp1/checkpoints", "team/exp1", "checkpoints"),
        ("s3://runs/exp1/checkpoints/latest", "exp1", "checkpoints/latest"),
        ("s3://runs/exp1/checkpoints/step-00000040.pt", "exp1", "checkpoints/step-00000040.pt"),
        ("s3://runs/checkpoints/step-00000040.dcp", "", "checkpoints/step-00000040.dcp"),
    ],
)
def test_a_readers_url_splits_into_the_run_and_the_path_inside(
    url: str, root: str, inside: str
) -> None:
    found = location.parse(url)
    assert found is not None
    assert reading.split_run(found) == (Location(bucket="runs", prefix=root), inside)


def test_an_upload_error_is_raised_by_the_next_submit_once() -> None:
    uploads = Uploads()

    def fails() -> None:
        raise StorageError("could not upload", hint="h")

    uploads.submit(fails, what="first")
    with pytest.raises(StorageError, match="could not upload"):
        uploads.submit(lambda: None, what="second")
    uploads.join()  # raised once: the second upload ran and succeeded


@pytest.mark.parametrize(
    ("code", "says", "hint"),
    [
        ("NoSuchBucket", "bucket 'runs' does not exist", "create the bucket first"),
        ("AccessDenied", "access to bucket 'runs' denied (AccessDenied)", "credentials"),
        ("InvalidAccessKeyId", "denied (InvalidAccessKeyId)", "AWS_PROFILE"),
        ("NoCredentialsError", "no credentials for bucket 'runs' were found", "credentials"),
        ("ReadTimeoutError", "the store for bucket 'runs' does not answer", "AWS_ENDPOINT_URL"),
        ("EndpointConnectionError", "does not answer (EndpointConnectionError)", "reach"),
        ("SlowDown", "in bucket 'runs' (SlowDown: please reduce", "AWS_ENDPOINT_URL"),
    ],
)
def test_each_store_failure_is_one_line_naming_the_bucket_and_the_cause(
    code: str, says: str, hint: str
) -> None:
    error = store_error("upload x to s3://runs/a/x", code, "please reduce\nyour rate",
                        Location(bucket="runs", prefix="a"))  # fmt: skip
    line = error.line()
    assert line.startswith("could not upload x to s3://runs/a/x")
    assert says in line
    assert hint in error.hint
    assert "\n" not in line


def test_the_default_probe_answers_within_a_minute_whatever_the_store_does() -> None:
    # Each try: connect, then wait for the answer; botocore's standard retries back off < 1 s.
    bound = probe_timeouts(config.load(None, []).storage.timeout_s)
    assert bound.attempts * (bound.connect_s + bound.read_s) + bound.attempts < 60


@pytest.mark.parametrize(
    ("size", "part_mib"),
    [(0, 8), (256 << 20, 8), (80_000 << 20, 8), (80_001 << 20, 9), (2 << 40, 210)],
)
def test_uploads_use_8_mib_parts_unless_a_file_needs_more_than_10000(
    size: int, part_mib: int
) -> None:
    part = part_bytes(size)
    assert part == part_mib << 20
    assert -(-size // part) <= 10_000
