"""Same commit, base image and wheelhouse => the same image: a second no-cache build's digest."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from container import image

pytestmark = pytest.mark.slow
SECOND = "localhost/trainbox:test-rebuild"


def test_two_no_cache_builds_of_one_commit_give_one_digest(built_image: str) -> None:
    # The first build's revision and time: a commit made meanwhile must not change the inputs.
    revision, epoch = _inputs(built_image)
    rebuilt = image.build(revision, epoch, tag=SECOND)
    try:
        if rebuilt != built_image:
            paths = image.differing_paths(built_image, rebuilt)
            pytest.fail(
                f"image {built_image[:12]} rebuilt as {rebuilt[:12]}; {len(paths)} paths differ:\n"
                + "\n".join(paths[:200])
                + "\nconfig: "
                + _config_differences(built_image, rebuilt)
            )
    finally:
        image.podman("rmi", SECOND, check=False)


def _inputs(image_id: str) -> tuple[str, int]:
    inspected = json.loads(image.podman("image", "inspect", image_id).stdout)[0]
    created = datetime.fromisoformat(inspected["Created"].replace("Z", "+00:00"))
    return inspected["Labels"]["org.opencontainers.image.revision"], int(created.timestamp())


def _config_differences(first: str, second: str) -> str:
    a, b = (json.loads(image.podman("image", "inspect", i).stdout)[0] for i in (first, second))
    keys = sorted(
        k for k in a.keys() | b.keys() if k not in ("Id", "RepoTags") and a.get(k) != b.get(k)
    )
    return ", ".join(keys) or "the same"
