"""A package's `__init__.py` is its face: a docstring, imports and `__all__`, nothing else.

Policy lives in a module named by its job, where a reader (and a patch in a test) finds it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trainbox

SOURCE = Path(trainbox.__file__).parent
# The package root keeps its lazy public names (a module __getattr__ and the table behind it):
# `import trainbox` must not import torch, so the CLI can pin CPUs before torch starts its threads.
EXEMPT = {SOURCE / "__init__.py"}
INITS = sorted(set(SOURCE.rglob("__init__.py")) - EXEMPT)


def beyond_a_face(tree: ast.Module) -> list[str]:
    """What `tree` holds beyond a docstring, imports and `__all__`, by line."""
    body = tree.body
    if ast.get_docstring(tree) is not None:
        body = body[1:]
    found = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if [ast.unparse(target) for target in targets] == ["__all__"]:
                continue
        found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


@pytest.mark.parametrize("path", INITS, ids=lambda path: str(path.relative_to(SOURCE.parent)))
def test_every_package_init_only_re_exports(path: Path) -> None:
    assert beyond_a_face(ast.parse(path.read_text(), filename=str(path))) == []


@pytest.mark.parametrize(
    "source",
    [
        "def detect(env): ...",
        "class Sink: ...",
        "QUEUE_LIMIT = 10_000",
        "if True:\n    import os",
    ],
)
def test_policy_in_an_init_is_caught(source: str) -> None:
    assert beyond_a_face(ast.parse(f'"""Doc."""\nimport os\n{source}\n')) != []


def test_a_face_passes() -> None:
    face = '"""Doc."""\nfrom os import path\n__all__ = ["path"]\n'
    assert beyond_a_face(ast.parse(face)) == []


def test_packages_are_found_at_all() -> None:
    # A glob that found nothing would pass the test above for the wrong reason.
    assert SOURCE / "launch" / "__init__.py" in INITS
