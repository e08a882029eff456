"""`trainbox config`'s view: the resolved config as YAML, each value marked with its source.

Issue 19, item 15: there was no way to see the resolved config without training.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainbox import config
from trainbox.commands.config import render

FILE = "train:\n  max_steps: 10\nmodel:\n  args: {hidden: 16, enc: {width: 8}}\n"
OVERRIDES = ["seed=3", "model.args.enc.depth=4", "train.amp=off"]


@pytest.fixture
def resolved(tmp_path: Path) -> config.Resolved:
    path = tmp_path / "c.yaml"
    path.write_text(FILE)
    return config.resolve(str(path), OVERRIDES)


def test_the_view_is_the_resolved_config_as_yaml(resolved: config.Resolved) -> None:
    assert yaml.safe_load(render(resolved)) == config.as_dict(resolved.config)


@pytest.mark.parametrize(
    ("line", "source"),
    [
        ("name: example", "default"),
        ("seed: 3", "override"),
        ("  max_steps: 10", "file"),
        ("  batch_size: 64", "default"),
        ("  amp: 'off'", "override"),
        ("    hidden: 16", "file"),
        ("      width: 8", "file"),
        ("      depth: 4", "override"),
        ("  args: {}", "default"),
    ],
)
def test_each_value_says_where_it_came_from(
    resolved: config.Resolved, line: str, source: str
) -> None:
    assert f"{line}  # {source}" in render(resolved).splitlines()


def test_a_replaced_mapping_is_all_override(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(FILE)
    shown = render(config.resolve(str(path), ["model.args={layers: 1}"]))
    assert "    layers: 1  # override" in shown.splitlines()
    assert "hidden" not in shown


def test_sections_carry_no_source(resolved: config.Resolved) -> None:
    lines = render(resolved).splitlines()
    assert "train:" in lines
    assert "  args:" in lines  # model.args holds entries of its own
