"""eval and predict fail together and fail early.

- A write that fails on rank 0 (a real full tmpfs) ends every rank with exit 2, not rank 0
  alone: the ranks agree on success before they leave the process group.
- A --checkpoint that does not exist is exit 2 at once, before joining the process group
  (here there is no peer to join, so a late check would wait for dist.timeout_s instead).

Two real processes started by hand (the `env` launcher), so each one's exit code is seen.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runs import QUICK, by_hand, train
from volumes import tmpfs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    train(run, *QUICK, "data.args.val_size=300")
    return run


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A 52 KiB tmpfs: predict's 3 parts of ~9 KB (+ manifest) fit, the merged copy does not."""
    with tmpfs(tmp_path / "volume", size_kib=52) as mount_point:
        yield mount_point


def test_a_failed_eval_output_on_rank_0_fails_every_rank(run_dir: Path, volume: Path) -> None:
    # Full: eval's JSON (about 400 bytes) needs a page that is not there.
    # Two statements: the buffered write only fails when flushed.
    with (  # noqa: PT012
        (volume / "filler").open("wb") as handle,
        pytest.raises(OSError, match="No space"),
    ):
        handle.write(b"\0" * 64 * 1024)
        handle.flush()
    results = by_hand("eval", "--checkpoint", str(run_dir), "--output", str(volume / "eval.json"))
    assert [code for code, _ in results] == [2, 2], results[0][1][-1500:] + results[1][1][-1500:]
    for _, stderr in results:
        assert "could not write --output" in stderr
    assert not (volume / "eval.json").exists()


def test_a_failed_predict_merge_on_rank_0_fails_every_rank(run_dir: Path, volume: Path) -> None:
    output = volume / "predictions.jsonl"
    results = by_hand("predict", "--checkpoint", str(run_dir), "--output", str(output),
                      "--chunk-size", "100")  # fmt: skip
    assert [code for code, _ in results] == [2, 2], results[0][1][-1500:] + results[1][1][-1500:]
    assert not output.exists()
    # Nothing computed is lost: the parts stay for a rerun on a volume with room.
    assert len(list((volume / "predictions.jsonl.parts").glob("part-*.jsonl"))) == 3


@pytest.mark.parametrize("command", ["eval", "predict"])
def test_a_missing_checkpoint_is_reported_before_joining(tmp_path: Path, command: str) -> None:
    started = time.monotonic()
    extra = ["--output", str(tmp_path / "p.csv")] if command == "predict" else []
    # Rank 0 alone: its peer never comes, so joining would wait dist.timeout_s (60 s).
    ((code, stderr),) = by_hand(command, "--checkpoint", str(tmp_path / "nope.pt"), *extra,
                                "dist.timeout_s=60", ranks=(0,))  # fmt: skip
    assert code == 2, stderr[-2000:]
    assert time.monotonic() - started < 30
    errors = [line for line in stderr.splitlines() if line.startswith("trainbox: error:")]
    assert len(errors) == 1
    assert "nope.pt" in errors[0]
    assert "HINT:" in errors[0]
    events = [json.loads(line).get("event") for line in stderr.splitlines() if line.startswith("{")]
    assert "cluster" not in events
