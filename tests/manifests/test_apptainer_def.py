"""apptainer/train.def has what an Apptainer build needs (Apptainer itself is not installable here)."""

from __future__ import annotations

import re
from pathlib import Path

DEF = Path(__file__).parents[2] / "apptainer" / "train.def"


def sections() -> dict[str, str]:
    text = DEF.read_text()
    parts = re.split(r"^%(\w+)\s*$", text, flags=re.M)
    return {name: body for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_header_bootstraps_from_the_oci_image_by_digest() -> None:
    header = re.split(r"^%", DEF.read_text(), maxsplit=1, flags=re.M)[0]
    assert re.search(r"^Bootstrap: docker$", header, re.M)
    # No default for DIGEST in %arguments: a build without --build-arg DIGEST=... fails.
    assert re.search(r"^From: \{\{ IMAGE \}\}@\{\{ DIGEST \}\}$", header, re.M)
    assert "DIGEST" not in sections()["arguments"]
    assert "{{ DIGEST }}" in sections()["labels"]
    assert "docker-archive" in header  # the login-node path is documented too


def test_sections() -> None:
    assert {"arguments", "labels", "environment", "runscript", "test"} <= sections().keys()


def test_runscript_is_the_image_entrypoint() -> None:
    assert 'exec /opt/trainbox/bin/trainbox-entrypoint "$@"' in sections()["runscript"]


def test_test_section_runs_doctor() -> None:
    assert "trainbox doctor" in sections()["test"]


def test_the_entrypoint_it_names_is_the_one_the_dockerfile_installs() -> None:
    dockerfile = (DEF.parents[1] / "Dockerfile").read_text()
    assert "/opt/trainbox/bin/trainbox-entrypoint" in dockerfile
