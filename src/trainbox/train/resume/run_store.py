"""A run whose run_dir is s3://: what each rank fetches at the start and uploads as it goes.

- **Start** (collective): rank 0 lists the prefix once and sends what it found; every rank
  drops the local checkpoints the store does not hold as complete, and fetches what it reads:
  rank 0 the run's top-level files (summary.json, metrics.jsonl, ...); every rank a one-file
  checkpoint (once per node); under fsdp each rank its share of the shards (the rest is
  fetched as DCP reads it).
- **Each checkpoint**: uploaded on a thread while training goes on; its marker last, then
  metrics.jsonl and the run's other files, then checkpoints beyond `train.keep_last` pruned.
  Rank 0 uploads a one-file checkpoint; under fsdp every rank its own shards, and rank 0
  the index, the record and, once every shard is in the store, the manifest.
- **End**: the last upload is waited for, then summary.json and the run's files go up.

A crash loses what was written since the last checkpoint's upload: metrics.jsonl lines of the
steps a resume trains again anyway.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from trainbox.config import Config
from trainbox.distributed import consensus
from trainbox.distributed.consensus import Problem, raise_first
from trainbox.errors import StorageError
from trainbox.launch.context import LaunchContext
from trainbox.logs import log
from trainbox.storage.mirror import SHARDED_MARKER, Mirror, Snapshot, note_source
from trainbox.storage.store import Entry, run_timeouts, summary
from trainbox.storage.uploads import Uploads

# How often rank 0 lists a sharded checkpoint's folder while waiting for every rank's shards.
_POLL_S = (0.2, 5.0)


class RunStore:
    """One rank's side of a run kept in an object store."""

    def __init__(
        self, mirror: Mirror, *, context: LaunchContext, sharded: bool, keep_last: int,
        wait_s: float,
    ) -> None:  # fmt: skip
        self.mirror, self.rank, self.world_size = mirror, context.rank, context.world_size
        self.sharded, self.keep_last, self.wait_s = sharded, keep_last, wait_s
        self.uploads = Uploads()

    @classmethod
    def for_run(cls, config: Config, context: LaunchContext) -> RunStore | None:
        """The RunStore of a run whose run_dir is s3:// (None for a path)."""
        timeouts = run_timeouts(config.storage.timeout_s)
        mirror = Mirror.for_url(config.run_dir, os.environ, timeouts=timeouts)
        if mirror is None:
            return None
        return cls(
            mirror,
            context=context,
            sharded=config.train.sharded,
            keep_last=config.train.keep_last,
            # Every rank's shards reach the store within the job's collective timeout, or the
            # upload counts as failed.
            wait_s=float(config.dist.timeout_s),
        )

    def fetch_for_start(self) -> None:
        """Bring the working copy in line with the store before resuming. Collective."""
        problem: Problem | None = None
        found: Snapshot | None = None
        if self.rank == 0:
            try:
                found = self.mirror.snapshot()
            except StorageError as err:
                problem = Problem(text="; ".join(err.problems), hint=err.hint)
        raise_first(problem)
        snapshot: Snapshot = consensus.from_rank0(found)
        try:
            # Files written on the way out (hang evidence, bad-node records) find the store by it.
            note_source(self.mirror.root, self.mirror.location.url)
            self.mirror.keep_only(snapshot.checkpoint)
            self.mirror.fetch(self._wanted(snapshot))
            if self.sharded and snapshot.checkpoint:
                self._note_source(snapshot.checkpoint)
        except StorageError as err:
            problem = Problem(text="; ".join(err.problems), hint=err.hint)
        raise_first(problem)
        if self.rank == 0:
            log.info("fetched run_dir", store=self.mirror.location.url,
                     checkpoint=snapshot.checkpoint, copy=str(self.mirror.root))  # fmt: skip

    def push_start(self) -> None:
        """Rank 0 uploads config.yaml and run.json as soon as they are written. Collective."""
        problem: Problem | None = None
        if self.rank == 0:
            try:
                self.mirror.push_run_files()
            except StorageError as err:
                problem = Problem(text="; ".join(err.problems), hint=err.hint)
        raise_first(problem)

    def _wanted(self, snapshot: Snapshot) -> dict[str, Entry]:
        # Rank 0 reads the files at the top (summary.json, metrics.jsonl, ...); folders such as
        # hang/ (a file per rank) stay in the store, where readers fetch them.
        top = {key: entry for key, entry in snapshot.run_files.items() if "/" not in key}
        wanted = top if self.rank == 0 else {}
        if snapshot.checkpoint is None:
            return wanted
        if self.sharded:
            wanted.update(snapshot.sharded_share(self.rank, self.world_size))
        else:
            wanted.update(snapshot.checkpoint_files)
        return wanted

    def _note_source(self, checkpoint: str) -> None:
        # The shards not fetched here are fetched as DCP reads them (checkpoint/shards.py).
        note_source(self.mirror.local(checkpoint), self.mirror.location.child(checkpoint).url)

    def before_local_prune(self) -> None:
        """Wait for the upload in flight: a local prune must not delete what it still reads."""
        self.uploads.join()

    def checkpoint_written(self, path: Path, *, hook: Callable[[str], None]) -> None:
        """Upload the checkpoint at `path` on a thread (the previous upload ends first).

        `hook(point)` runs at each of faults.UPLOAD_POINTS.
        """
        self.uploads.submit(lambda: self._publish(path, hook), what=path.name)

    def finish(self) -> None:
        """The run's end (rank 0): the last upload waited for, then the run's files uploaded."""
        self.uploads.join()
        if self.rank == 0:
            self.mirror.push_run_files()
        log.info("object store requests", **summary(self.mirror.store.requests))

    def _publish(self, path: Path, hook: Callable[[str], None]) -> None:
        started = time.perf_counter()
        if self.sharded:
            self._publish_shards(path, hook)
        elif self.rank == 0:
            checkpoint = self.mirror.relative(path)
            self.mirror.upload([checkpoint])
            hook("upload")
            self.mirror.upload([f"{checkpoint}.sha256"])
        hook("marker")
        if self.rank == 0:
            self.mirror.push_run_files()
            pruned = self.mirror.prune(self.keep_last)
            log.info("checkpoint uploaded", checkpoint=path.name, store=self.mirror.location.url,
                     seconds=round(time.perf_counter() - started, 3),
                     pruned=len(pruned))  # fmt: skip

    def _publish_shards(self, final: Path, hook: Callable[[str], None]) -> None:
        """This rank's shards; rank 0 also the index and record, then the manifest once every
        shard it lists is in the store."""
        temp = final.with_name(f".{final.name}.tmp")
        mine = f"__{self.rank}_"
        # On rank 0's node the folder has been renamed; elsewhere the shards are in the temp one.
        source = final if final.is_dir() else temp
        names = sorted(p.name for p in source.iterdir() if p.name.startswith(mine))
        folder = self.mirror.relative(final)
        for name in names:
            self.mirror.store.upload(source / name, f"{folder}/{name}")
        if source == temp:
            for name in names:
                (temp / name).unlink(missing_ok=True)
        if self.rank != 0:
            return
        self.mirror.upload([f"{folder}/.metadata", f"{folder}/record.pt"])
        self._wait_for_shards(final, folder)
        hook("upload")
        self.mirror.upload([f"{folder}/{SHARDED_MARKER}"])

    def _wait_for_shards(self, final: Path, folder: str) -> None:
        listed: Mapping[str, Mapping[str, object]] = json.loads(
            (final / SHARDED_MARKER).read_text()
        )["files"]
        deadline = time.monotonic() + self.wait_s
        pause = _POLL_S[0]
        while True:
            there = self.mirror.store.list(f"{folder}/")
            missing = [
                name for name, entry in listed.items()
                if (found := there.get(f"{folder}/{name}")) is None or found.size != entry["bytes"]
            ]  # fmt: skip
            if not missing:
                return
            if time.monotonic() > deadline:
                raise StorageError(
                    f"the shards of {final.name} did not all reach {self.mirror.location.url}"
                    f" within {self.wait_s:.0f} s (missing: {', '.join(missing[:4])})",
                    hint="those ranks' logs name the upload that failed; the checkpoints"
                    " complete in the store are intact",
                )
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])
