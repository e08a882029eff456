"""One meaning per class name: a newcomer who meets `Verdict` in one module must not find a
different `Verdict` in another.

Every module under src/trainbox is read with `ast`; the classes it defines at module level
(inside a module-level `if` or `try` too, such as a TYPE_CHECKING block) are gathered by name.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import trainbox

SOURCE = Path(trainbox.__file__).parent


def module_level_classes(body: list[ast.stmt]) -> Iterator[ast.ClassDef]:
    """Classes defined at module level: directly, or in a module-level if/else, try or with."""
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node
        elif isinstance(node, ast.If | ast.With | ast.Try | ast.TryStar):
            for block in ("body", "orelse", "finalbody"):
                yield from module_level_classes(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from module_level_classes(handler.body)


def classes_by_name(root: Path) -> dict[str, list[str]]:
    """Each class name defined at module level under `root`, with where (path:line)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in module_level_classes(tree.body):
            found[node.name].append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_two_classes_share_a_name() -> None:
    shared = {name: where for name, where in classes_by_name(SOURCE).items() if len(where) > 1}
    assert shared == {}


def test_the_classes_are_read_at_all(tmp_path: Path) -> None:
    # A walk that found nothing would pass the test above for the wrong reason.
    found = classes_by_name(SOURCE)
    assert "LaunchContext" in found
    assert "StartupFacts" in found
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("class Twice:\n    class Inner:\n        pass\n")
    (package / "b.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    class Twice:\n        pass\n"
        "def f():\n    class Inner:\n        pass\n"
    )
    twice = classes_by_name(package)
    assert sorted(twice) == ["Twice"]
    assert len(twice["Twice"]) == 2
