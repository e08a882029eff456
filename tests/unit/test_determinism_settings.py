"""Deterministic mode's decisions: which variables it adds, and that a user's own one stays."""

from __future__ import annotations

import pytest

from trainbox.train.resume import determinism


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
        ({"CUBLAS_WORKSPACE_CONFIG": ""}, {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
        ({"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, {}),
    ],
)
def test_env_updates(env: dict[str, str], expected: dict[str, str]) -> None:
    assert determinism.env_updates(env) == expected
