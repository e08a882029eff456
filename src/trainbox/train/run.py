"""`trainbox run`: build model and data from the config's factories, then api.Trainer."""

from __future__ import annotations

from typing import Any

from trainbox import affinity, api, factories
from trainbox.bootstrap import Prepared
from trainbox.config import Config
from trainbox.preempt import Requests
from trainbox.train import seeding


def train(
    config: Config, prepared: Prepared, *, requests: Requests | None = None
) -> dict[str, Any]:
    """Build model and data, join the process group, agree with the peers, train.

    Raises Stopped (exit 143) when a stop signal or the deadline ended training early.
    """
    context, plan = prepared.context, prepared.plan
    # Every rank seeds identically before building, so the initial weights agree everywhere.
    seeding.seed_all(config.seed)
    model = factories.build_model(config.model.factory, config.model.args)
    data = factories.build_data(config.data.factory, config.data.args)
    if plan is not None:
        if data.max_workers is not None and config.pinning.num_workers == "auto":
            plan = affinity.with_workers(
                plan,
                data.max_workers,
                reason="the dataset holds its samples in memory",
                grow_threads=config.pinning.num_threads == "auto",
            )
        affinity.set_torch_threads(plan)
    with api.init_distributed(
        context, backend=config.dist.backend, timeout_s=config.dist.timeout_s
    ) as session:
        own = (
            prepared.survey.gpus[session.device.index]
            if session.device.type == "cuda" and prepared.survey.gpus
            else None
        )
        trainer = api.Trainer(
            config,
            session,
            model=model,
            data=data,
            num_workers=plan.num_workers if plan else 0,
            worker_init=affinity.worker_init(plan) if plan else None,
            cpu_count=plan.budget if plan else None,
            gpu_model=own.name if own else None,
            requests=requests,
            from_factories=True,
        )
        return trainer.fit()
