"""DataLoader workers for the dataset an eval or predict reads."""

from __future__ import annotations

from trainbox.affinity import loader
from trainbox.config import PinningConfig
from trainbox.dist import Session


def loader_workers(session: Session, max_workers: int | None, pinning: PinningConfig) -> int:
    """Workers for a dataset capped at `max_workers`; CPUs they would waste go to threads."""
    plan = loader.size_threads(
        session.plan,
        max_workers,
        auto_workers=pinning.num_workers == "auto",
        auto_threads=pinning.num_threads == "auto",
    )
    return plan.num_workers if plan else 0
