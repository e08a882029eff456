"""The image's provenance file: the lock's sha256 and the git revision, or Nones outside an image."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox.process.provenance import Provenance, read

NONE = Provenance(lock_sha256=None, revision=None)


def test_an_image_names_its_lock_hash_and_revision(tmp_path: Path) -> None:
    (tmp_path / "provenance.json").write_text(
        '{"lock": "requirements-cpu.lock", "lock_sha256": "ab12", "revision": "4517e54"}'
    )
    assert read(tmp_path) == Provenance(lock_sha256="ab12", revision="4517e54")


@pytest.mark.parametrize(
    "text",
    [None, "not json", "[1, 2]", '{"lock_sha256": 3, "revision": ""}'],
    ids=["absent", "unreadable", "not-an-object", "wrong-types"],
)
def test_no_usable_file_means_no_provenance(tmp_path: Path, text: str | None) -> None:
    if text is not None:
        (tmp_path / "provenance.json").write_text(text)
    assert read(tmp_path) == NONE
