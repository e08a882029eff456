"""The process group an eval or predict command works in, and agreement on bad input."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from trainbox import affinity, api, watchdog
from trainbox.bootstrap import Prepared
from trainbox.config import Config, PinningConfig
from trainbox.errors import DistributedError
from trainbox.infer import problems as problem_list
from trainbox.infer.problems import Problem
from trainbox.launch.context import LaunchContext
from trainbox.train import objective


@dataclass(frozen=True, kw_only=True, slots=True)
class Session:
    """One rank inside the job's process group."""

    # Where this process sits in the job.
    context: LaunchContext
    # This rank's device.
    device: torch.device
    # What the CPU plan allows (None: this process was not planned, e.g. a test).
    plan: affinity.CpuPlan | None

    @property
    def rank0(self) -> bool:
        """Whether this rank writes the outputs."""
        return self.context.rank == 0

    def loader_workers(self, max_workers: int | None, pinning: PinningConfig) -> int:
        """DataLoader workers for a dataset; CPUs that workers would waste go to threads."""
        if self.plan is None:
            return 0
        plan = self.plan
        if max_workers is not None and pinning.num_workers == "auto":
            plan = affinity.with_workers(
                plan,
                max_workers,
                reason="the dataset holds its samples in memory",
                grow_threads=pinning.num_threads == "auto",
            )
        affinity.set_torch_threads(plan)
        return plan.num_workers

    def autocast(self, amp: str) -> contextlib.AbstractContextManager[Any]:
        """The trainer's mixed precision for `train.amp` (auto: bf16 on a GPU that has it)."""
        # The trainer's own rule, so a checkpoint is evaluated in the precision it trained in.
        return objective.autocast(objective.amp_dtype(amp, self.device), self.device)


@contextlib.contextmanager
def joined(config: Config, prepared: Prepared, *, work: str) -> Iterator[Session]:
    """Pick the device, size torch's threads, join the group and check the peers agree.

    A collective that fails inside (a dead peer, a timeout) becomes a DistributedError (exit 4).
    """
    context, plan = prepared.context, prepared.plan
    if plan is not None:
        affinity.set_torch_threads(plan)
    with api.init_distributed(
        context, backend=config.dist.backend, timeout_s=config.dist.timeout_s
    ) as joined_group:
        device = joined_group.device
        own = (
            prepared.survey.gpus[device.index]
            if device.type == "cuda" and prepared.survey.gpus
            else None
        )
        api.agree_with_peers(
            config,
            joined_group,
            cpu_count=plan.budget if plan else len(os.sched_getaffinity(0)),
            gpu_model=own.name if own else None,
        )
        try:
            yield Session(context=context, device=device, plan=plan)
        except RuntimeError as err:
            if not watchdog.is_comm_failure(err):
                raise
            first = str(err).strip().splitlines()[0]
            raise DistributedError(
                f"rank {context.rank} lost its peers during {work}: {first}",
                hint="the other ranks' logs say which one stopped first; rerun the command"
                " (predict reuses the parts already written)",
            ) from err


def raise_together(mine: list[Problem], *, world_size: int) -> None:
    """Every rank raises the same UsageError listing every rank's problems, or none does."""
    gathered: list[Any] = [None] * world_size
    torch_dist.all_gather_object(gathered, [(p.text, p.hint) for p in mine])
    found = [Problem(text=text, hint=hint) for pairs in gathered for text, hint in pairs]
    error = problem_list.combined(found)
    if error is not None:
        raise error


def from_rank0(value: Any) -> Any:
    """Rank 0's `value`, on every rank."""
    box = [value]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]
