"""dist.recovery=in_process, the group side: the process group's generations.

A process group that lost a rank cannot be mended, so the survivors leave it and form the next
generation, with the dead rank's spare in its place, on torchrun's agent store (which outlives
every worker). Generation 0 is the group every run starts with, under the prefix it always had;
generation k lives under `<prefix>/gen-k`.

Which generation a process joins is decided without a coordinator:
- a survivor of generation g joins g + 1;
- a spare follows the pids that held its rank before it, newest first: the first one found in
  the store names the generation it joined, g. The spare joins g + 1 if g was formed or given
  up on (the survivors have moved on), else g (the survivors still wait there for this rank).
  None found: the rank's first trainer died before joining anything, so generation 0.
Every process writes which generation it is about to join before joining, so the next spare can
follow it. Each costs O(1) store requests per rank per recovery.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as torch_dist
from torch.distributed import distributed_c10d

from trainbox.logs import log
from trainbox.process import keeper

# Generations a process tries in a row before it gives up (a peer lost while each one forms).
MOST_ATTEMPTS = 5
# How much longer than two collective timeouts the ranks of a new generation wait for each other:
# room for a spare started from scratch (a torch import and the model built on a busy node).
ARRIVAL_SLACK_S = 60.0


class Generations:
    """This rank's process group generations on the agent's store."""

    def __init__(
        self,
        client: torch_dist.Store,
        prefix: str,
        *,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        device: torch.device,
    ) -> None:
        self.client, self.prefix = client, prefix
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.timeout = timedelta(seconds=timeout_s)
        self.device = device
        # The generation this process is in (or joining).
        self.current = 0

    def store(self, generation: int) -> torch_dist.Store:
        """The store generation `generation`'s group meets on."""
        if generation == 0:
            return torch_dist.PrefixStore(self.prefix, self.client)
        return torch_dist.PrefixStore(f"{self.prefix}/gen-{generation}", self.client)

    def register(self, generation: int) -> None:
        """Say, before joining, which generation this process joins (a spare follows it)."""
        self.current = generation
        self.client.set(self._key(f"rank-{self.rank}/pid-{os.getpid()}"), str(generation))

    def target_for_spare(self, predecessors: tuple[int, ...]) -> int:
        """The generation a spare joins after `predecessors` held its rank (module docstring)."""
        for pid in reversed(predecessors):
            key = self._key(f"rank-{self.rank}/pid-{pid}")
            if self.client.check([key]):
                joined = int(self.client.get(key))
                moved_on = self.client.check([self._key(f"formed-{joined}")]) or self.client.check(
                    [self._key(f"closed-{joined}")]
                )
                return joined + 1 if moved_on else joined
        return 0

    def join(self, generation: int, *, waiting: Callable[[], None] = lambda: None) -> None:
        """Register, wait for every rank to arrive, then form generation `generation`'s default
        process group (`waiting`, called now and then meanwhile, is the watchdog's mark)."""
        self.register(generation)
        log.info("joining the process group", generation=generation)
        self.arrive(generation, waiting)
        if not torch_dist.is_initialized():
            # Groups meet under store keys numbered by a per-process count of groups made, which
            # destroy_process_group resets so that recovered trainers agree on them. A join that
            # failed half way counted its group and left nothing to destroy: without this, a
            # survivor of a failed join and a fresh spare wait on different keys until timeout.
            distributed_c10d._world.group_count = 0
        torch_dist.init_process_group(
            backend=self.backend,
            store=self.store(generation),
            rank=self.rank,
            world_size=self.world_size,
            timeout=self.timeout,
            device_id=self.device if self.device.type == "cuda" else None,
        )
        self.client.set(self._key(f"formed-{generation}"), "1")

    def join_first_formed(self, generation: int, *, attempts: int) -> None:
        """join(generation); where that fails (a peer lost while it forms), the next one, at
        most `attempts` in all. Raises the last failure."""
        for attempt in range(attempts):
            try:
                self.join(generation + attempt)
                return
            except RuntimeError as err:
                log.warning("joining failed: trying the next generation", error=str(err)[:200])
                self.leave()
                if attempt == attempts - 1:
                    raise

    def arrive(self, generation: int, waiting: Callable[[], None]) -> None:
        """Wait until world_size processes have come to `generation` (O(1) requests each).

        The wait is longer than a collective's: survivors may first sit out dist.timeout_s in a
        collective that lost a peer, and a spare that died on the way is replaced by one that
        has to start from scratch. A process that arrived and then died still counts: the group
        then fails to form and everyone moves on to the next generation.
        """
        arrived, everyone = (
            self._key(f"gen-{generation}/arrived"),
            self._key(f"gen-{generation}/all"),
        )
        if self.client.add(arrived, 1) >= self.world_size:
            self.client.set(everyone, "1")
        deadline = time.monotonic() + 2 * self.timeout.total_seconds() + ARRIVAL_SLACK_S
        # Each unanswered wait logs a line of torch's: wake only often enough for the watchdog.
        every = timedelta(seconds=min(max(self.timeout.total_seconds() / 4, 0.25), 10.0))
        while True:
            try:
                self.client.wait([everyone], every)
                return
            except torch_dist.DistStoreError:
                if time.monotonic() >= deadline:
                    raise
                waiting()

    def leave(self) -> None:
        """Give up on the current generation: tell the store, and drop its group."""
        with contextlib.suppress(Exception):
            self.client.set(self._key(f"closed-{self.current}"), "1")
        # Objects holding the group (DDP's reducer) must be gone before the group is.
        gc.collect()
        if not torch_dist.is_initialized():
            return
        group = torch_dist.distributed_c10d._get_default_group()
        if self.backend == "nccl":
            # NCCL's communicators may still wait on the dead peer: abort them, or destroying
            # the group waits for them.
            with contextlib.suppress(Exception):
                group.abort()
        with contextlib.suppress(Exception):
            torch_dist.destroy_process_group()

    def announce(self, news: str) -> None:
        """A spare's news about the rank it replaced, for rank 0 to record (one key each)."""
        count = self.client.add(self._key(f"gen-{self.current}/joined"), 1)
        self.client.set(self._key(f"gen-{self.current}/joined-{count}"), news)

    def announcements(self, generation: int) -> list[dict[str, object]]:
        """The spares' news of `generation`, in the order they joined."""
        count = self.client.add(self._key(f"gen-{generation}/joined"), 0)
        keys = [self._key(f"gen-{generation}/joined-{index}") for index in range(1, count + 1)]
        return [json.loads(value) for value in self.client.multi_get(keys)] if keys else []

    def count_recoveries(self, lost: int) -> None:
        """Add `lost` ranks to the run's count of recoveries (this torchrun round's)."""
        self.client.add(self._key("recovered"), lost)

    def recoveries(self) -> int:
        """Ranks recovered in place so far."""
        return self.client.add(self._key("recovered"), 0)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/recovery/{name}"


def await_promotion(env: dict[str, str] | os._Environ[str]) -> keeper.Promotion | None:
    """A spare's wait: block until its keeper promotes it (None: the keeper let it go)."""
    fd = int(env[keeper.SPARE_FD])
    line = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while not line.endswith(b"\n"):
            chunk = pipe.read(4096)
            if not chunk:
                return None
            line += chunk
    return keeper.Promotion.from_line(line)
