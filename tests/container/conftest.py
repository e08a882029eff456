"""The container tier: one real image build per session (tests/container/image.py)."""

from __future__ import annotations

import subprocess

import pytest

import tiers
from container import image


@pytest.fixture(scope="session")
def built_image() -> str:
    """The trainbox image, built from this checkout with podman."""
    reason = image.missing_requirements()
    if reason is not None:
        tiers.unavailable(reason)
    revision = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=image.ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        or "unknown"
    )
    return image.build(revision, image.source_date_epoch())
