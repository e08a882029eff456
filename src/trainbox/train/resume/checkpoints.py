"""The trainer's checkpoints: every rank's RNG gathered, rank 0 writes (on a thread if
`train.async_save`), old ones pruned, and every rank learns whether the write worked.

Under `train.strategy=fsdp` every rank writes its own shards (checkpoint/shards.py) and rank 0
the rest of the payload; with `train.async_save` each rank copies its shards to CPU memory and
writes them on a thread that talks to the other ranks over a process group of its own."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from trainbox.checkpoint import files, shards
from trainbox.checkpoint.saver import BackgroundSaver, stable_storages
from trainbox.config import Config, as_dict, fingerprint
from trainbox.distributed import consensus
from trainbox.errors import StorageError
from trainbox.launch.context import LaunchContext
from trainbox.logs import log
from trainbox.train.resume.determinism import capture_rng
from trainbox.train.resume.run_store import RunStore
from trainbox.train.resume.state import TrainState
from trainbox.train.watch.control import RunControl


class Checkpointer:
    """One run's checkpoint directory as every rank sees it; only rank 0 touches the files."""

    def __init__(
        self,
        directory: Path,
        *,
        context: LaunchContext,
        device: torch.device,
        config: Config,
        control: RunControl,
        store: RunStore | None = None,
    ) -> None:
        self.directory, self.rank0 = directory, context.rank == 0
        # run_dir=s3://: each checkpoint is uploaded after it is written
        # (train/resume/run_store.py).
        self.store = store
        # fsdp: sharded checkpoints, a folder per step.
        self.sharded = config.train.sharded
        # run_dir=s3:// keeps train.keep_last checkpoints in the store and only the newest in
        # the working copy: the node's disk needs room for two (the next is written beside it).
        keep_here = 1 if store is not None else config.train.keep_last
        self.device, self.keep_last, self.control = device, keep_here, control
        # What every checkpoint records of the run's config (resuming judges a new one by it).
        self.run_config = as_dict(config)
        self.config_hash = fingerprint(config)
        background = config.train.async_save
        # A background sharded save exchanges plans and digests while training runs its own
        # collectives: on one group they could interleave, so the writer gets a gloo group
        # (made once, collectively; gloo, since the writer's tensors are in CPU memory).
        self.group = (
            torch_dist.new_group(backend="gloo", timeout=timedelta(seconds=config.dist.timeout_s))
            if background and self.sharded
            else None
        )
        save = self._write_shards if self.sharded else files.save
        self.saver = BackgroundSaver(hook=self._at_save, save=save) if background else None
        # The step of the write in flight (fault points name it, not the step training reached).
        self.writing = 0

    def save(self, state: TrainState, *, final: bool) -> None:
        """Checkpoint `state` at its step (collective: every rank calls it at the same step).

        A background write is waited for before the next one and at the end; `final` writes
        in the foreground.
        """
        step = state.step
        self.control.mark("the checkpoint's RNG gather", step)
        # Only rank 0 writes the file, so only it receives the N RNG states (and the N counts
        # of replaced stream samples, which the checkpoint keeps summed).
        gathered = consensus.to_rank0((capture_rng(), state.samples_skipped()))
        states = None if gathered is None else [rng for rng, _ in gathered]
        skipped = 0 if gathered is None else sum(count for _, count in gathered)
        if self.sharded:
            self._save_shards(state, states, skipped, final=final)
            return
        problem: StorageError | None = None
        if states is not None:
            payload = state.payload(
                config=self.run_config, config_hash=self.config_hash, rng=states, skipped=skipped
            )
            self.control.mark("writing the checkpoint", step)
            # Weights and optimizer state change only in the next optimizer step, which waits
            # for the saver's settle() (StepHooks.backward_done): a background save copies them
            # while forward/backward run.
            background = self.saver is not None and not final
            stable = stable_storages(state.module, state.optimizer) if background else frozenset()
            try:
                self._write(step, payload.to_dict(), final=final, stable=stable)
            except StorageError as err:
                problem = err
        self._agree(problem, step)

    def drain(self, step: int) -> None:
        """Wait for a background write before anything that must follow it (summary, exit)."""
        problem: StorageError | None = None
        try:
            if self.saver is not None:
                self.saver.join()
            if self.store is not None:
                self.store.uploads.join()
        except StorageError as err:
            problem = err
        self._agree(problem, step)

    def publish_run_files(self, step: int) -> None:
        """run_dir=s3://: upload the run's files once the last checkpoint is in. Collective."""
        if self.store is None:
            return
        problem: StorageError | None = None
        try:
            self.store.finish()
        except StorageError as err:
            problem = err
        self._agree(problem, step)

    def close(self) -> None:
        """Leaving on an error: let a write in flight finish whole (it is atomic anyway)."""
        if self.saver is not None and self.saver.busy:
            with contextlib.suppress(StorageError):
                self.saver.join()
        if self.store is not None:
            # An upload in flight finishes (or fails) before the process goes.
            with contextlib.suppress(StorageError):
                self.store.uploads.join()

    def path_for(self, step: int) -> Path:
        """Where the checkpoint of `step` lives."""
        if self.sharded:
            return shards.path_for(self.directory, step)
        return files.path_for(self.directory, step)

    def last_good(self) -> str:
        """The newest checkpoint, in words, for an error that stops training."""
        kept = (shards if self.sharded else files).existing(self.directory)
        return f"the last good checkpoint is {kept[-1]}" if kept else "no checkpoint was written"

    def _save_shards(
        self, state: TrainState, rng: list[object] | None, skipped: int, *, final: bool
    ) -> None:
        """Every rank writes its shards, rank 0 the record and manifest, then prunes. Collective.

        With a saver (and not `final`), each rank's shards are copied to CPU memory here and
        written on its thread; the previous background save is waited for first.
        """
        step = state.step
        if self.saver is not None:
            self.drain(step)
        self.writing = step
        record = None
        if rng is not None:
            payload = state.payload(
                config=self.run_config,
                config_hash=self.config_hash,
                rng=rng,
                sharded=True,
                skipped=skipped,
            )
            record = payload.to_dict()
        self.control.mark("writing the sharded checkpoint", step)
        tensors = state.sharded_tensors()
        if self.saver is not None and not final:
            # Every tensor is copied before submit returns (none is left for settle()): the
            # copy is this rank's 1/W of the state, and the next step may change it at once.
            both = {"tensors": tensors, "record": record}
            self.saver.submit(self.directory, step, both, then=self._shards_written)
            return
        path = shards.save(
            self.directory, step, tensors, record=record, device=self.device, hook=self._at_save
        )
        problem: StorageError | None = None
        try:
            self._shards_written(path)
        except StorageError as err:
            problem = err
        self._agree(problem, step)

    def _write_shards(
        self, directory: Path, step: int, payload: dict[str, Any], *, hook: files.Hook
    ) -> Path:
        """A background sharded save (on the saver's thread), over the writer's own group."""
        return shards.save(directory, step, payload["tensors"], record=payload["record"],
                           device=torch.device("cpu"), hook=hook, group=self.group)  # fmt: skip

    def _shards_written(self, path: Path) -> None:
        # Rank 0 prunes and logs; on the writer thread when saving in the background.
        if self.store is not None:
            self.store.before_local_prune()
        if self.rank0:
            shards.prune(self.directory, self.keep_last, hook=self._at_save)
            log.info("checkpoint", step=self.writing, path=str(path))
        self._upload(path)

    def _write(
        self, step: int, payload: dict[str, object], *, final: bool, stable: frozenset[int]
    ) -> None:
        # One write at a time: the previous background write ends (or fails) first.
        if self.saver is not None:
            self.saver.join()
        self.writing = step
        if self.saver is not None and not final:
            self.saver.submit(self.directory, step, payload, then=self._written, stable=stable)
        else:
            self._written(files.save(self.directory, step, payload, hook=self._at_save))

    def _written(self, path: Path) -> None:
        # On the writer thread when saving in the background.
        if self.store is not None:
            self.store.before_local_prune()
        files.prune(self.directory, self.keep_last, hook=self._at_save)
        log.info("checkpoint", step=self.writing, path=str(path))
        self._upload(path)

    def _upload(self, path: Path) -> None:
        """run_dir=s3://: upload the checkpoint just written, on the store's thread."""
        if self.store is None:
            return
        step = self.writing
        self.store.checkpoint_written(path, hook=lambda point: self.control.at_save(point, step))

    def _agree(self, problem: StorageError | None, step: int) -> None:
        self.control.mark("waiting for rank 0's checkpoint write", step)
        # Nobody moves on (or exits) while rank 0 may still be writing, and everyone learns
        # whether it worked: a failed rank 0 would otherwise leave the rest waiting.
        if not consensus.all_ok(problem is None, self.device):
            raise problem or StorageError(
                f"rank 0 could not write a checkpoint (step {step} or before)",
                hint="rank 0's log names the file and the reason; earlier checkpoints are intact",
            )

    def _at_save(self, point: str) -> None:
        self.control.at_save(point, self.writing)
