"""Storage faults end to end: a save cut short, a damaged checkpoint, a disk that fills up.

Every run is real: `trainbox run` with two gloo processes, under torchrun or as env:// processes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainbox.checkpoint import files as checkpoint

from freeport import free_port
from runs import QUICK, clean_env, shared_run, summary, train, trainbox_argv
from volumes import tmpfs

pytestmark = pytest.mark.slow

# As in test_reproducibility: checkpoints at steps 7, 14, 21, ...; a step takes milliseconds.
CONFIG = [*QUICK, "model.args.hidden=512"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted two-process run that every recovered run must reproduce (the same as
    test_reproducibility's, so one run serves both)."""
    return shared_run(tmp_path_factory, *CONFIG, nproc=2)


def resumed_step(stderr: str) -> int:
    """The step the run's `resumed` log line names (rank 0's)."""
    for line in stderr.splitlines():
        if line.startswith("{") and json.loads(line).get("event") == "resumed":
            return int(json.loads(line)["step"])
    raise AssertionError(f"the run did not resume:\n{stderr[-3000:]}")


def latest_step(run_dir: Path) -> int:
    return int(checkpoint.load(run_dir / "checkpoints" / "latest")["step"])


# (save point of step 14 where the writer dies, the step `latest` then loads, the step resumed)
# One point per outcome; tests/unit/test_checkpoint.py kills the writer at every save point.
CRASHES = [
    ("write", 7, 7),
    ("rename", 7, 14),
    ("latest", 14, 14),
]


@pytest.mark.parametrize(("point", "latest", "resumed"), CRASHES)
def test_a_writer_killed_mid_save_resumes_to_the_same_parameters(
    reference: Path, tmp_path: Path, point: str, latest: int, resumed: int
) -> None:
    crashed = train(
        tmp_path,
        *CONFIG,
        nproc=2,
        check=False,
        env={"TRAINBOX_FAULT": f"crash:point={point}:step=14"},
    )
    assert crashed.returncode != 0
    # torchrun reports how rank 0 ended: the fault's SIGKILL, not an error of its own.
    assert "Signal 9 (SIGKILL)" in crashed.stderr, crashed.stderr[-3000:]
    assert not (tmp_path / "summary.json").exists()
    assert latest_step(tmp_path) == latest
    rerun = train(tmp_path, *CONFIG, nproc=2)
    assert resumed_step(rerun.stderr) == resumed
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    assert latest_step(tmp_path) == 40


def test_background_saves_give_the_same_checkpoints_and_parameters(
    reference: Path, tmp_path: Path
) -> None:
    train(tmp_path, *CONFIG, "train.async_save=true", nproc=2)
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == sorted(p.name for p in (reference / "checkpoints").iterdir())
    for step in (7, 21, 40):
        ours = checkpoint.load(tmp_path / "checkpoints" / f"step-{step:08d}.pt")
        theirs = checkpoint.load(reference / "checkpoints" / f"step-{step:08d}.pt")
        assert ours["step"] == step
        assert all(ours["model"][k].equal(v) for k, v in theirs["model"].items())


def test_a_background_writer_killed_mid_save_resumes_to_the_same_parameters(
    reference: Path, tmp_path: Path
) -> None:
    # The writer thread dies with its process while training has moved past step 14.
    fault = {"TRAINBOX_FAULT": "crash:point=write:step=14"}
    crashed = train(tmp_path, *CONFIG, "train.async_save=true", nproc=2, check=False, env=fault)
    assert "Signal 9 (SIGKILL)" in crashed.stderr, crashed.stderr[-3000:]
    assert latest_step(tmp_path) == 7
    rerun = train(tmp_path, *CONFIG, "train.async_save=true", nproc=2)
    assert resumed_step(rerun.stderr) == 7
    assert summary(tmp_path)["params_sha256"] == summary(reference)["params_sha256"]


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate_and_drop_the_checksum(path: Path) -> None:
    # Without its sidecar only torch.load itself can notice.
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    path.with_name(path.name + ".sha256").unlink()


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A run whose rank 0 was killed at step 16, past its checkpoints at steps 7 and 14 (run_dir,
    exit code): each damage test damages a copy of it."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    proc = train(
        run_dir, *CONFIG, nproc=2, check=False, env={"TRAINBOX_FAULT": "kill:rank=0:step=16"}
    )
    return run_dir, proc.returncode


@pytest.mark.parametrize("damage", [_flip_a_byte, _truncate_and_drop_the_checksum])
def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_reproduces(
    reference: Path, stopped: tuple[Path, int], tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    original, returncode = stopped
    assert returncode != 0
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-a", str(original), str(run_dir)], check=True)
    assert not (run_dir / "summary.json").exists()
    newest = run_dir / "checkpoints" / "step-00000014.pt"
    assert os.readlink(run_dir / "checkpoints" / "latest") == newest.name
    damage(newest)
    rerun = train(run_dir, *CONFIG, nproc=2)
    assert "skipping damaged checkpoint" in rerun.stderr
    assert resumed_step(rerun.stderr) == 7
    assert summary(run_dir)["params_sha256"] == summary(reference)["params_sha256"]


@pytest.fixture
def small_volume(reference: Path, tmp_path: Path) -> Iterator[Path]:
    """A tmpfs that holds one checkpoint of CONFIG (and the run's small files) but not two."""
    one = (reference / "checkpoints" / "step-00000007.pt").stat().st_size
    size_kib = (one + one // 2) // 1024 + 256
    with tmpfs(tmp_path / "volume", size_kib=size_kib) as mount_point:
        yield mount_point


@pytest.mark.parametrize("mode", ["train.async_save=false", "train.async_save=true"])
def test_a_full_disk_stops_every_rank_with_exit_2_and_keeps_the_previous_checkpoint(
    small_volume: Path, tmp_path: Path, mode: str
) -> None:
    run_dir = small_volume / "run"
    port = free_port()
    # Two plain env:// processes, not torchrun, whose agent would turn every exit code into 1.
    ranks = []
    for rank in (0, 1):
        env = clean_env(
            RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        )  # fmt: skip
        # Logs go beside the volume: on it they would take the space the test measures.
        with (tmp_path / f"rank{rank}.log").open("w") as log:
            # Preflight would refuse so small a volume up front; the test is about filling it.
            argv = trainbox_argv(
                1, "run", f"run_dir={run_dir}", *CONFIG, "preflight.min_free_disk_mib=0", mode
            )
            ranks.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [rank.wait(timeout=120) for rank in ranks]
    logs = [(tmp_path / f"rank{rank}.log").read_text() for rank in (0, 1)]
    assert codes == [2, 2], logs[0][-3000:]
    (error,) = [line for line in logs[0].splitlines() if line.startswith("trainbox: error: ")]
    ckpts = run_dir / "checkpoints"
    assert (
        f"could not save checkpoint {ckpts / 'step-00000014.pt'}: No space left on device. HINT: "
        in error
    )
    assert f"{ckpts / 'step-00000007.pt'} is the newest intact checkpoint" in error
    # A background write's failure surfaces at the next save (step 21) or the end.
    assert "rank 0 could not write a checkpoint (step " in logs[1]
    assert sorted(path.name for path in ckpts.iterdir()) == [
        "latest", "step-00000007.pt", "step-00000007.pt.sha256"
    ]  # fmt: skip
    assert latest_step(run_dir) == 7
    assert not (run_dir / "summary.json").exists()
