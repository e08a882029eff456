"""Dependencies point one way: CLI → commands → runtime → train / infer → the rest → errors, logs.

Every `import` under src/trainbox (inside functions and TYPE_CHECKING blocks too) is read with
`ast`; a module may import its own layer or any layer below, never one above.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterable
from pathlib import Path

import pytest

import trainbox

SOURCE = Path(trainbox.__file__).parent
# Highest first: a module may import its own layer or any layer below it. Each package is its own
# layer, so the stack is also the reading order for a newcomer, from the user's command down to
# the errors every part raises. The package root (the lazy public names) stands outside.
LAYERS = (
    ("cli", ("trainbox.cli", "trainbox.__main__")),
    ("commands", ("trainbox.commands",)),
    ("api", ("trainbox.api",)),
    ("runtime", ("trainbox.runtime",)),
    ("network", ("trainbox.network",)),
    ("infer", ("trainbox.infer",)),
    # The built-in examples are user code: they build on the data contract (train/data/).
    ("tasks", ("trainbox.tasks",)),
    # The loop on top, then its parts: what survives a restart builds on what watches the run,
    # which builds on the model's spreading, the steps, and the data at the bottom.
    ("train", ("trainbox.train",)),
    ("train.resume", ("trainbox.train.resume",)),
    ("train.watch", ("trainbox.train.watch",)),
    ("train.parallel", ("trainbox.train.parallel",)),
    ("train.steps", ("trainbox.train.steps",)),
    ("train.data", ("trainbox.train.data",)),
    ("streams", ("trainbox.streams",)),
    ("health", ("trainbox.health",)),
    ("watchdog", ("trainbox.watchdog",)),
    ("sinks", ("trainbox.sinks",)),
    ("checkpoint", ("trainbox.checkpoint",)),
    ("distributed", ("trainbox.distributed",)),
    ("process", ("trainbox.process",)),
    ("affinity", ("trainbox.affinity",)),
    ("preflight", ("trainbox.preflight",)),
    ("config", ("trainbox.config",)),
    ("testing", ("trainbox.testing",)),
    ("atomic", ("trainbox.atomic",)),
    ("launch", ("trainbox.launch",)),
    # run_dir=s3://: the store, its URLs and the working copy; config, preflight, checkpoints and
    # the writers on the way out (process, watchdog) all reach it.
    ("storage", ("trainbox.storage",)),
    # logs binds a LaunchContext, a plain dataclass that imports nothing of trainbox; version
    # holds only the version string, so every layer may read it.
    (
        "base",
        ("trainbox.errors", "trainbox.logs", "trainbox.launch.context", "trainbox.version"),
    ),
)
# The only modules at the top: what a user meets (the API, the CLI, its errors and logs, the
# version), and the one atomic writer that checkpoints, metrics and predictions all share.
TOP_LEVEL = {"__init__", "__main__", "api", "cli", "errors", "logs", "version", "atomic"}
# What `from trainbox import NAME` may name: the package's modules and subpackages.
SUBMODULES = {path.stem for path in SOURCE.glob("*.py")} | {
    path.parent.name for path in SOURCE.glob("*/__init__.py")
}
# The façade is for users: no module of trainbox builds on it (the root's lazy names aside).
ONLY_USERS_IMPORT = ("trainbox.api",)


def layer(module: str) -> int:
    """The rank of `module`'s layer (0 = top); the longest matching prefix decides."""
    best, rank = "", len(LAYERS)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > len(best):
                best, rank = prefix, index
    return rank


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, module: str, *, package: bool) -> set[str]:
    """The trainbox modules `tree` imports; `from pkg import sub` counts as pkg.sub."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "trainbox" or name.startswith("trainbox.")}


def edges() -> list[tuple[str, str]]:
    """(importer, imported) for every module under src/trainbox, only real modules."""
    files = {module_name(path): path for path in SOURCE.rglob("*.py")}
    found = []
    for name, path in sorted(files.items()):
        tree = ast.parse(path.read_text(), filename=str(path))
        package = path.name == "__init__.py"
        for target in sorted(imported(tree, name, package=package)):
            # `from trainbox.x import SomeName`: keep the module, drop the attribute.
            while target not in files and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name:
                found.append((name, target))
    return found


def violations(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """Each import that points up a layer, into the façade, or from train/ into infer/."""
    wrong = []
    for importer, target in pairs:
        if importer == "trainbox":
            continue  # the root's lazy names are the public API itself
        if layer(target) < layer(importer):
            wrong.append(
                f"{importer} ({LAYERS[layer(importer)][0]}) imports {target}"
                f" ({LAYERS[layer(target)][0]})"
            )
        elif target in ONLY_USERS_IMPORT and importer != target:
            wrong.append(f"{importer} imports the façade {target}")
    return wrong


def test_every_import_points_down_a_layer() -> None:
    assert violations(edges()) == []


def test_no_module_reads_names_of_the_package_root() -> None:
    """The root's names lead up to the façade; the version lives below everything."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "trainbox" and not node.level:
                names = {alias.name for alias in node.names} - set(SUBMODULES)
                found += [f"{module_name(path)} imports trainbox.{name}" for name in names]
    assert found == []


def test_no_trainbox_module_is_imported_under_another_name() -> None:
    """`from trainbox.infer import chunks as chunking` makes a reader look twice."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                module = getattr(node, "module", None) or ""
                for alias in node.names:
                    name = f"{module}.{alias.name}" if module else alias.name
                    if alias.asname and name.startswith("trainbox"):
                        found.append(f"{module_name(path)}: {name} as {alias.asname}")
    assert found == []


def test_every_package_is_a_layer() -> None:
    packages = {path.parent.name for path in SOURCE.glob("*/__init__.py")}
    named = {prefix.removeprefix("trainbox.") for _, prefixes in LAYERS for prefix in prefixes}
    assert packages - named == set()


def test_every_subpackage_of_train_is_a_layer() -> None:
    packages = {module_name(path) for path in (SOURCE / "train").glob("*/__init__.py")}
    named = {prefix for _, prefixes in LAYERS for prefix in prefixes}
    assert packages - named == set()


# More modules than this in one folder and a newcomer no longer finds a thing from the tree.
MOST_MODULES = 14


def test_no_folder_holds_more_than_a_newcomer_can_scan() -> None:
    crowded = {
        str(folder.relative_to(SOURCE.parent)): count
        for folder in [SOURCE, *(path.parent for path in SOURCE.rglob("__init__.py"))]
        if (count := len(list(folder.glob("*.py")))) > MOST_MODULES
    }
    assert crowded == {}


def test_the_top_level_holds_only_what_a_user_meets() -> None:
    assert {path.stem for path in SOURCE.glob("*.py")} == TOP_LEVEL


def test_the_graph_is_read_at_all() -> None:
    # A parser that found nothing would pass the test above for the wrong reason.
    found = set(edges())
    assert ("trainbox.commands.registry", "trainbox.commands.run") in found
    assert ("trainbox.runtime.trainer", "trainbox.train.loop") in found
    assert ("trainbox.commands.run", "trainbox.runtime.trainer") in found  # inside a function


@pytest.mark.parametrize(
    ("importer", "target"),
    [
        ("trainbox.train.loop", "trainbox.runtime.group"),
        ("trainbox.infer.prediction", "trainbox.api"),
        ("trainbox.infer.evaluation", "trainbox.runtime.from_checkpoint"),
        ("trainbox.process.launching", "trainbox.distributed.consensus"),
        ("trainbox.runtime.trainer", "trainbox.cli"),
        ("trainbox.process.bootstrap", "trainbox.train.resume.determinism"),
        ("trainbox.train.data.map_style", "trainbox.train.steps.functions"),
        ("trainbox.train.resume.state", "trainbox.train.loop"),
        ("trainbox.train.evaluate", "trainbox.infer.model"),
        ("trainbox.logs", "trainbox.launch.slurm"),
        ("trainbox.commands.run", "trainbox.api"),
    ],
)
def test_an_import_pointing_up_is_caught(importer: str, target: str) -> None:
    assert violations([(importer, target)]) != []


@pytest.mark.parametrize(
    ("importer", "target"),
    [
        ("trainbox.cli", "trainbox.commands.run"),
        ("trainbox.commands.run", "trainbox.runtime.trainer"),
        ("trainbox.runtime.trainer", "trainbox.train.loop"),
        ("trainbox.runtime.from_checkpoint", "trainbox.process.launching"),
        ("trainbox.infer.model", "trainbox.train.steps.functions"),
        ("trainbox.train.resume.checkpoints", "trainbox.checkpoint.files"),
        ("trainbox.train.resume.checkpoints", "trainbox.train.watch.control"),
        ("trainbox.train.parallel.ddp", "trainbox.train.data.batches"),
        ("trainbox.process.bootstrap", "trainbox.affinity"),
        ("trainbox.logs", "trainbox.launch.context"),
        ("trainbox.checkpoint.schema", "trainbox.version"),
    ],
)
def test_an_import_pointing_down_is_allowed(importer: str, target: str) -> None:
    assert violations([(importer, target)]) == []


def test_modules_never_import_each_other_in_a_circle() -> None:
    """Within a layer too, dependencies point one way: a newcomer can read the modules in order.

    A module importing its own package (its `__init__`) and the root's lazy names are left out:
    neither is a dependency on another concept.
    """
    graph: dict[str, set[str]] = {}
    for importer, target in edges():
        if "trainbox" in (importer, target) or importer.startswith(target + "."):
            continue
        graph.setdefault(importer, set()).add(target)
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"modules import each other in a circle: {' -> '.join(err.args[1])}")
    assert "trainbox.train.loop" in order
