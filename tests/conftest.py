"""Shared test plumbing: the tier switch lives in tests/tiers.py."""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

# The suite runs more busy processes than it has cores. OpenMP's default keeps a waiting thread
# spinning, so a one-process run's second intra-op thread burns the core another test needs: on
# 2 cores beside two busy loops, `trainbox run` took 33 s and 31 CPU-s, and 15 s and 9 CPU-s with
# a passive wait. Set before torch is imported: the OpenMP runtime reads it once, at load. It
# changes no result, only how threads wait; the xdist workers and every run inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# tests import helpers such as `tiers` and `launchers.slurm_cluster` by plain name.
sys.path.insert(0, str(Path(__file__).parent))

import tiers
from launchers.slurm_cluster import SlurmCluster, missing_requirements, start_cluster

TESTS_DIR = Path(__file__).parent

# Job steps must run this venv's python; srun/sbatch pass the caller's PATH on to them.
VENV_BIN = Path(sys.executable).parent

# In-process tests share an xdist worker, and an earlier one can leave a gloo process group in a
# reference cycle. If a later test's forked DataLoader worker collected it, the group's destructor
# would wait for gloo threads that fork does not copy, and the run would hang at its end. Freezing
# in the child leaves everything inherited to the parent's collector; new garbage still goes.
os.register_at_fork(after_in_child=gc.freeze)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real two-node (n1, n2) Slurm cluster on loopback for the whole session."""
    reason = missing_requirements()
    if reason is not None:
        tiers.unavailable(reason)
    with start_cluster(tmp_path_factory.mktemp("slurm"), python_bin_dir=VENV_BIN) as cluster:
        yield cluster


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another program listens on (and accepts on, saying nothing)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield holder.getsockname()[1]


# TRAINBOX_TEST_CPU=FILE appends one JSON line per test: its wall seconds, the CPU seconds of
# the processes it started and waited for (setup and teardown included), the whole machine's
# busy CPU seconds meanwhile, and which xdist worker ran it and when it ended (each worker's
# timeline: the suite ends when its longest one does). The suite's time is set by CPU on 2
# cores; this shows which tests compute and which wait. Processes that Slurm or podman start
# are not this process's children: run such a tier alone (`-n 0`), and the machine's figure
# counts them.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    path = os.environ.get("TRAINBOX_TEST_CPU")
    if not path:
        yield
        return
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_before = machine_busy_s()
    yield
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = {"test": item.nodeid, "wall_s": round(time.monotonic() - started, 2),
            "children_cpu_s": round(cpu, 2),
            "machine_cpu_s": round(machine_busy_s() - busy_before, 2),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "ended": round(time.time(), 1)}  # fmt: skip
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    # Steal (the eighth) is time the hypervisor gave to other machines: not ours.
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(autouse=True)
def _structlog_reset() -> Iterator[None]:
    """A test that runs the CLI in-process points structlog at pytest's captured stderr, which
    is closed once the test ends: a later test on the same worker would log into a closed file."""
    import structlog

    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    """Tests that run the CLI in-process leave its handlers (SIG_IGN at exit) to no other test."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


# scripts/test runs pytest with `-n 3 --dist loadgroup` (pytest-xdist): worker processes, each
# taking the next test or group as it finishes one. A group runs whole on one worker, and with
# three workers one of them runs the "system" group and nothing else (tests/lanes.py).
#
# "system": whatever shares something machine-wide runs on one worker, one test at a time.
# tests/launchers: the Slurm cluster (a session fixture per worker: two would each start
# slurmctld, slurmd n1/n2 and perhaps munged, and the first to finish stops the munged the
# other uses; modules also request it lazily with getfixturevalue, which no fixture list
# shows), Open MPI as root and /etc/hosts edits. tests/container: podman, its fixed image tags
# and the wheelhouse/ folder of this checkout, and the Slurm cluster again.
SYSTEM_GROUP = "system"
SYSTEM_TIERS = frozenset({"launchers", "container"})
SYSTEM_FIXTURES = frozenset({"slurm_cluster", "built_image"})
# A fixture of these scopes is made once per worker that runs one of its tests, so its tests
# share a group (per parameter, if it has some): each module's reference run happens once.
SHARED_SCOPES = frozenset({"package", "module", "class"})


def xdist_group(item: pytest.Item) -> str | None:
    """The one xdist group `item` must run in, or None where any worker may run it."""
    try:
        where = Path(item.path).relative_to(TESTS_DIR)
    except ValueError:
        where = Path()
    tier = where.parts[0] if where.parts else ""
    if tier in SYSTEM_TIERS or SYSTEM_FIXTURES & set(getattr(item, "fixturenames", ())):
        return SYSTEM_GROUP
    # Each item's fixture closure, as pytest resolved it: the last definition is the one used.
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    shared = sorted(
        name for name, chain in defs.items() if chain and chain[-1].scope in SHARED_SCOPES
    )
    if not shared:
        return None
    indices = getattr(getattr(item, "callspec", None), "indices", {})
    # No "[", "]" or "@" in a group name: xdist finds the group after the last "@" of a node id.
    module = item.nodeid.split("::", 1)[0]
    return ":".join([module, *(f"{name}={indices[name]}" for name in shared if name in indices)])


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist never calls it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` with a worker kept for the system group (tests/lanes.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from lanes import SystemLaneScheduling

    return SystemLaneScheduling(config, log, group=SYSTEM_GROUP)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook appends each group to the node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each item that needs it in its xdist group (nothing to do where xdist is off)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = xdist_group(item)
        if group is None:
            continue
        # xdist joins all the groups an item is marked with into one new name: one mark only.
        # A group set by hand stands, unless it would take the item out of "system".
        marked = list(item.iter_markers("xdist_group"))
        if not marked:
            item.add_marker(pytest.mark.xdist_group(group))
        elif group == SYSTEM_GROUP and [mark.args for mark in marked] != [(SYSTEM_GROUP,)]:
            raise pytest.UsageError(f"{item.nodeid} must be in xdist group {SYSTEM_GROUP!r} only")


# Every tier must be collected in CI: a directory pytest quietly ignores would pass as green.
TIERS = ("unit", "dist", "launchers", "manifests", "container")


def require_every_tier(config: pytest.Config, paths: Iterable[Path]) -> None:
    """With TRAINBOX_REQUIRE_ALL=1 and the whole suite selected, fail if a tier collects nothing
    (`paths`: the file of each collected test)."""
    if not tiers.REQUIRE_ALL or config.args not in ([], ["tests"]):
        return
    seen = {path.relative_to(TESTS_DIR).parts[0] for path in paths}
    missing = [tier for tier in TIERS if tier not in seen]
    if missing:
        raise pytest.UsageError(f"no tests collected from tests/{', tests/'.join(missing)}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tier check, where this process runs the tests (no xdist, or -n 0)."""
    # An xdist worker's error here would be lost: the controller checks what workers collected.
    if not hasattr(session.config, "workerinput"):
        require_every_tier(session.config, (Path(item.path) for item in session.items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    """The checks in the xdist controller, which collects nothing itself, on each worker's node
    ids (every worker collects the whole selection): every tier, and the "system" group."""
    config: pytest.Config = node.config
    paths = [config.rootpath / nodeid.split("::", 1)[0] for nodeid in ids]
    require_every_tier(config, paths)
    # xdist appends the group it schedules by to each node id, with --dist loadgroup only, and
    # only where it can: pytest 9.2 ignores the way pytest-xdist 3.8 does it, so the groups
    # would be silently dropped (hence the pin on pytest in pyproject.toml).
    for nodeid, path in zip(ids, paths, strict=True):
        tier = path.relative_to(TESTS_DIR).parts[0] if path.is_relative_to(TESTS_DIR) else ""
        if tier in SYSTEM_TIERS and not nodeid.endswith(f"@{SYSTEM_GROUP}"):
            fix = (
                f"pytest {pytest.__version__} drops the groups: install the test extra's pytest"
                if config.getvalue("dist") == "loadgroup"
                else "use --dist loadgroup, as scripts/test does, or -n 0"
            )
            raise pytest.UsageError(
                f"{nodeid} is not in xdist group {SYSTEM_GROUP!r}, so two workers could share "
                f"the Slurm cluster or podman; {fix}"
            )
