"""Training from tar shards for real: 3 ranks x 2 DataLoader workers over shards of very
different sizes, a kill -9 mid-epoch whose resume ends with the uninterrupted run's
params_sha256, a resume at another world size that continues the epoch, and shards that are cut
short or corrupt stopping with exit 2 and one line naming them (also when one rank of a node
meets the corrupt sample and the others then fail in their all-reduce)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch

from trainbox.streams import plan

from runs import clean_env, killed_after_first_checkpoint, summary, train, trainbox_argv
from stream_shards import write_uneven

pytestmark = pytest.mark.slow

SIZES = (5, 40, 17, 3, 60, 11)
VAL_SIZES = (7, 30, 2)
SEED, BATCH, WORLD, WORKERS, WINDOW = 0, 4, 3, 2, 8


def config(shards: Path) -> list[str]:
    return [
        "data.factory=trainbox.tasks.shards:data",
        f"data.args.train={shards}",
        f"data.args.val={shards.parent / 'val'}",
        f"data.args.shuffle_buffer={WINDOW}",
        "model.factory=trainbox.tasks.mlp:mlp",
        "model.args.in_features=2",
        "model.args.out_features=3",
        "model.args.hidden=256",
        f"train.batch_size={BATCH}",
        "train.max_steps=30",
        "train.log_every=1",
        "train.ckpt_every=7",
        "train.keep_last=20",
        "train.eval_every=30",
        f"pinning.num_workers={WORKERS}",
        f"seed={SEED}",
    ]


def events(stderr: str, name: str) -> list[dict[str, object]]:
    found = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [event for event in found if event.get("event") == name]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("streams")
    write_uneven(root / "val", VAL_SIZES, seed=1)
    return write_uneven(root / "shards", SIZES, seed=0)


@pytest.fixture(scope="module")
def reference(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One uninterrupted 3-rank run (2 workers each) and its stderr."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    proc = train(run_dir, *config(shards), nproc=WORLD)
    return run_dir, proc.stderr


def test_every_rank_takes_the_same_steps_and_the_dropped_samples_are_logged(
    reference: tuple[Path, str],
) -> None:
    run_dir, stderr = reference
    assert summary(run_dir)["steps"] == 30
    epochs = events(stderr, "stream epoch")
    whole = plan.first_plan(
        seed=SEED,
        epoch=0,
        total=sum(SIZES),
        world_size=WORLD,
        batch_size=BATCH,
        lanes=WORKERS,
        window=WINDOW,
    )
    assert [e["epoch"] for e in epochs] == [0, 1, 2]  # 30 steps of 11 per epoch
    assert {(e["steps"], e["dropped"], e["samples"]) for e in epochs} == {
        (whole.per_rank, whole.dropped, sum(SIZES))
    }


def test_evaluation_of_a_stream_counts_every_sample_once_at_any_world_size(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    run_dir = reference[0]
    trained = summary(run_dir)["val_metrics"]
    assert trained["val_samples"] == sum(VAL_SIZES)
    out = tmp_path / "eval.json"
    argv = trainbox_argv(1, "eval", "--checkpoint", str(run_dir), "--output", str(out))
    proc = subprocess.run(
        argv, env=clean_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 3 ranks in training, 1 process here: the same batches, so the same bits.
    assert json.loads(out.read_text())["val_metrics"] == trained


def test_a_run_killed_mid_epoch_resumes_to_the_same_parameters(
    shards: Path, reference: tuple[Path, str], tmp_path: Path
) -> None:
    # The first checkpoint is step 7, mid-epoch.
    killed_after_first_checkpoint(WORLD, tmp_path, *config(shards))
    train(tmp_path, *config(shards), nproc=WORLD)
    assert summary(tmp_path)["params_sha256"] == summary(reference[0])["params_sha256"]


def test_a_resume_at_another_world_size_continues_the_epoch(
    shards: Path, reference: tuple[Path, str], tmp_path: Path
) -> None:
    step14 = reference[0] / "checkpoints" / "step-00000014.pt"
    proc = train(tmp_path, *config(shards), f"train.resume={step14}", nproc=2)
    # Step 14 is batch 3 of epoch 1: 3 ranks had read 3 batches of 4 each.
    assert events(proc.stderr, "stream re-split over a new world size")
    first = events(proc.stderr, "stream epoch")[0]
    assert (first["epoch"], first["start"], first["samples"]) == (1, 0, sum(SIZES) - 3 * 3 * 4)
    assert summary(tmp_path)["steps"] == 30


def test_a_shard_cut_short_stops_the_run_at_start_naming_it(shards: Path, tmp_path: Path) -> None:
    cut = shutil.copytree(shards, tmp_path / "cut" / "shards")
    shutil.copytree(shards.parent / "val", tmp_path / "cut" / "val")
    victim = cut / "shard-000002.tar"
    # Only the end-of-archive padding goes: every sample still reads, only the size tells.
    written = victim.stat().st_size
    victim.write_bytes(victim.read_bytes()[:-1024])
    run_dir = tmp_path / "run"
    proc = train(run_dir, *config(cut), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = f"shard {victim} is {written - 1024} bytes, not the {written} written. HINT:"
    assert line in proc.stderr
    assert not (run_dir / "checkpoints").exists()


def corrupt_copy(
    shards: Path, into: Path, *, world: int = 1, rank: int = 0, before: int | None = None
) -> tuple[Path, int, str]:
    """A copy of the shards with one sample's .npy spoiled (same size, so only reading sees
    it): one that rank `rank` of `world` reads after the checkpoint of step 7 (and before
    step `before`), and that the start-up probe (every second sample in manifest order) does
    not. (its shard, its index there, key)"""
    whole = plan.first_plan(
        seed=SEED,
        epoch=0,
        total=sum(SIZES),
        world_size=world,
        batch_size=BATCH,
        lanes=WORKERS,
        window=WINDOW,
    )
    order = plan.epoch_order(SIZES, seed=SEED, epoch=0)
    batches = range(7, before or whole.per_rank)  # batch 7 is step 8's
    later = [i for b in batches for i in plan.batch_indices(whole, rank, b)]
    shard, member = next(
        (shard, member)
        for shard, member in map(order.locate, later)
        if (sum(SIZES[:shard]) + member) % 2
    )
    key = f"s{sum(SIZES[:shard]) + member:06d}"
    bad = shutil.copytree(shards, into / "shards")
    shutil.copytree(shards.parent / "val", into / "val")
    path = bad / f"shard-{shard:06d}.tar"
    with tarfile.open(path) as tar:
        offset = tar.getmember(f"{key}.npy").offset_data
    data = bytearray(path.read_bytes())
    data[offset : offset + 6] = b"XXXXXX"  # not the .npy magic
    path.write_bytes(bytes(data))
    return path, member, key


def test_a_corrupt_sample_on_one_rank_stops_the_node_with_exit_2_and_keeps_the_checkpoints(
    shards: Path, tmp_path: Path
) -> None:
    # Node mode: `trainbox run` starts the 3 workers itself. Only rank 1 meets the sample; the
    # others fail in their next all-reduce, and the node still exits with rank 1's code. The
    # checkpoints written before stay.
    path, member, key = corrupt_copy(shards, tmp_path / "bad", world=WORLD, rank=1)
    run_dir = tmp_path / "run"
    proc = train(run_dir, *config(path.parent), f"dist.procs_per_node={WORLD}", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = f"shard {path} sample {member} ({key}): trainbox.streams.decode:pair failed"
    assert line in proc.stderr
    hint = "HINT: rewrite the shard (trainbox.tasks.to_shards), or set data.args.on_corrupt=skip"
    assert hint in proc.stderr
    assert "step-00000007.pt" in {p.name for p in (run_dir / "checkpoints").glob("step-*.pt")}
    assert not (run_dir / "summary.json").exists()


def skipped_in(checkpoint: Path) -> int:
    """The replaced samples a checkpoint counts, all ranks together."""
    payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return int(payload["data_position"]["skipped"])


def reads_of(sample: int, start: plan.StreamPosition, steps: int) -> int:
    """How often the next `steps` steps from `start` read manifest-order `sample`, all ranks."""
    position, found = start, 0
    while steps:
        epoch = position.plan
        order = plan.epoch_order(SIZES, seed=SEED, epoch=epoch.epoch)
        take = min(steps, epoch.per_rank - position.done)
        for rank in range(epoch.world_size):
            for batch in range(position.done, position.done + take):
                for shard, member in map(order.locate, plan.batch_indices(epoch, rank, batch)):
                    found += sum(SIZES[:shard]) + member == sample
        position, steps = plan.advance(position, take, total=sum(SIZES)), steps - take
    return found


def test_a_corrupt_sample_is_replaced_and_counted_once_across_resumes_and_ranks(
    shards: Path, tmp_path: Path
) -> None:
    # Read at one of steps 8-14 by the one process: the checkpoint of step 14 counts it.
    path, member, key = corrupt_copy(shards, tmp_path / "bad", before=14)
    run_dir = tmp_path / "run"
    proc = train(run_dir, *config(path.parent), "data.args.on_corrupt=skip")
    replaced = events(proc.stderr, "corrupt sample replaced")
    assert replaced
    assert all(f"sample {member} ({key})" in str(event["sample"]) for event in replaced)
    assert [event["skipped"] for event in replaced] == list(range(1, len(replaced) + 1))
    assert (summary(run_dir)["steps"], summary(run_dir)["skipped_samples"]) == (30, len(replaced))
    checkpoints = run_dir / "checkpoints"
    assert skipped_in(checkpoints / "step-00000007.pt") == 0
    assert skipped_in(checkpoints / "step-00000014.pt") == 1

    # Resumed at 2 ranks: the count carries over once (not once per rank), and each rank adds
    # the sample each time it meets it again.
    step14 = checkpoints / "step-00000014.pt"
    again = tmp_path / "again"
    train(again, *config(path.parent), "data.args.on_corrupt=skip", f"train.resume={step14}",
          nproc=2)  # fmt: skip
    saved = torch.load(step14, map_location="cpu", weights_only=True)["data_position"]
    at = plan.replan(
        plan.position_from_dict(saved, total=sum(SIZES)),
        world_size=2,
        batch_size=BATCH,
        lanes=WORKERS,
    )
    sample = int(key[1:])
    assert summary(again)["skipped_samples"] == 1 + reads_of(sample, at, 30 - 14)


def test_in_process_recovery_refuses_a_stream_at_start(shards: Path, tmp_path: Path) -> None:
    # A stream's position lives in each rank's memory: a spare could not rebuild it. Node mode
    # with its keepers, but no spares (dist.max_recoveries=0): the refusal needs none.
    overrides = ["dist.procs_per_node=2", "dist.recovery=in_process", "dist.max_recoveries=0"]
    proc = train(tmp_path / "run", *config(shards), *overrides, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "dist.recovery=in_process needs a map-style dataset" in proc.stderr
    assert "HINT: use dist.recovery=restart with streamed data" in proc.stderr
