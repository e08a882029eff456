"""Every user package under examples/ stands on its own: it never imports trainbox, depends only
on torch, its README opens with the commands that train it, and its configs load."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from trainbox import config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PACKAGES = sorted(path.parent for path in EXAMPLES.glob("*/pyproject.toml"))


def configs(package: Path) -> list[Path]:
    """The package's configs: config.yaml, or one per stage (pretrain.yaml, finetune.yaml)."""
    return sorted(package.glob("*.yaml"))


def test_there_are_packages_to_check() -> None:
    names = {path.name for path in PACKAGES}
    assert {"user_model", "locator", "tabular_dict", "masked_autoencoder"} <= names
    assert all(configs(package) for package in PACKAGES)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda path: path.name)
def test_the_package_never_imports_trainbox_and_needs_only_torch(package: Path) -> None:
    project = tomllib.loads((package / "pyproject.toml").read_text())
    sources = sorted(package.rglob("*.py"))
    assert sources
    for source in sources:
        assert not re.search(r"^\s*(import|from)\s+trainbox\b", source.read_text(), re.M), source
    deps = project["project"]["dependencies"]
    assert [re.split(r"[<>=~ ]", dep)[0] for dep in deps] == ["torch"]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda path: path.name)
def test_the_readme_opens_with_the_command_that_trains_it(package: Path) -> None:
    readme = (package / "README.md").read_text()
    first_block = readme.split("```")[1]
    for path in configs(package):
        assert f"trainbox run --config examples/{package.name}/{path.name}" in first_block
    assert f"PYTHONPATH=examples/{package.name} " in readme


@pytest.mark.parametrize("package", PACKAGES, ids=lambda path: path.name)
def test_the_config_loads(package: Path) -> None:
    for path in configs(package):
        settings = config.load(str(path), [])
        assert settings.model.factory, path
        assert settings.data.factory, path
