"""Text that names a file or module names one that exists: the docs, docs/extending.md's recipes,
and the docstrings and comments under src/trainbox. A move that leaves a name behind fails here,
so a newcomer following the text never looks for a file that is gone."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import trainbox

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "trainbox"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = sorted(path.parent.name for path in SRC.glob("*/__init__.py"))
# A file inside the package, written from its package down (`train/data/seam.py`), maybe after
# `src/trainbox/`. A bare `streams.py` is left alone: in a listing it sits under its folder.
MODULE_PATH = re.compile(
    rf"(?<![\w./-])(?:src/trainbox/)?((?:{'|'.join(PACKAGES)})(?:/\w+)+\.py)\b"
)
# A file or folder of the repository outside the package.
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:tests|benchmarks|examples|scripts|acceptance|tools|docs|k8s|slurm|docker"
    r"|apptainer)/[\w./-]*\w)"
)
DOTTED = re.compile(r"(?<![\w.])(trainbox(?:\.\w+)+)")
# Files named after the project (trainbox.lock, trainbox.tar), not modules.
FILE_SUFFIXES = {"lock", "tar", "sif", "yaml", "json", "txt", "md"}


def docstrings_and_comments(path: Path) -> str:
    source = path.read_text()
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = [ast.get_docstring(node) or "" for node in ast.walk(ast.parse(source))
            if isinstance(node, kinds)]  # fmt: skip
    comments = [line.split("#", 1)[1] for line in source.splitlines() if "#" in line]
    return "\n".join(docs + comments)


def texts() -> Iterator[tuple[str, str]]:
    """(where, text) for every page of docs and every module's docstrings and comments."""
    for page in PAGES:
        yield str(page.relative_to(ROOT)), page.read_text()
    for path in sorted(SRC.rglob("*.py")):
        yield str(path.relative_to(ROOT)), docstrings_and_comments(path)


def defined_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def is_module(name: str) -> bool:
    """`trainbox.a.b` is a module or package, a name one defines, or a public name of the root."""
    parts = name.split(".")
    if len(parts) == 2 and parts[1] in trainbox._API:  # the root's lazy public names
        return True
    for cut in range(len(parts), 0, -1):
        base = ROOT / "src" / Path(*parts[:cut])
        found = [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()]
        if found:
            return cut == len(parts) or parts[cut] in defined_names(found[0])
    return False


def missing(where: str, text: str) -> list[str]:
    """The paths and module names `text` gives that do not exist."""
    found = [m for m in MODULE_PATH.findall(text) if not (SRC / m).exists()]
    found += [
        path
        for path in (p.rstrip(".") for p in REPO_PATH.findall(text))
        # `tests/unit/test_fuzz_` stands for a family of files.
        if not path.endswith("_") and not (ROOT / path).exists()
    ]
    found += [
        name
        for name in (n.rstrip(".") for n in DOTTED.findall(text))
        if name.rsplit(".", 1)[1] not in FILE_SUFFIXES and not is_module(name)
    ]
    return [f"{where}: {name}" for name in found]


def test_every_path_the_extending_guide_names_exists() -> None:
    page = ROOT / "docs" / "extending.md"
    named = MODULE_PATH.findall(page.read_text()) + REPO_PATH.findall(page.read_text())
    # A recipe page that names nothing would pass for the wrong reason.
    assert len(named) > 20
    assert missing("docs/extending.md", page.read_text()) == []


def test_docs_and_docstrings_name_only_modules_that_exist() -> None:
    found = [line for where, text in texts() for line in missing(where, text)]
    assert found == []


@pytest.mark.parametrize(
    "text",
    [
        "see `train/loop2.py`",
        "lives in src/trainbox/train/data.py",
        "copy tests/unit/test_nothing_here.py",
        "trainbox.train.resume_policy decides",
    ],
)
def test_a_name_that_is_gone_is_caught(text: str) -> None:
    assert missing("page", text) != []


@pytest.mark.parametrize(
    "text",
    [
        "see `train/loop.py` and src/trainbox/train/data/seam.py",
        "copy tests/unit/test_layers.py",
        "`trainbox.train.data.contract.Datasets` and trainbox.Trainer",
        "a user's train.py, and trainbox.lock",
    ],
)
def test_a_name_that_exists_passes(text: str) -> None:
    assert missing("page", text) == []
