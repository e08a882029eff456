"""The compatibility matrix of `trainbox exec`: scripts written as their libraries' docs show
them (examples/clients/), each behind `trainbox exec` under every launcher that suits it.

Lightning's Trainer, Lightning Fabric, Hugging Face Accelerate (plain `python`, no `accelerate
launch`), PyTorch's DDP tutorial for torchrun, and a script that `torch.multiprocessing.spawn`s
its own workers, one launcher task per node. None imports trainbox. Every process of a run
creates `rank-<rank>.json` (exclusively) with the rank, world size and local rank its library
reports, and the all-reduced sum of the ranks: neither separate one-process jobs nor two worlds
writing into one folder can pass for one world.

Each case runs once per module (a results cache) and must end within TIMEOUT_S: a world that
never forms fails its case instead of blocking the suite.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

import tiers
from launchers.slurm_cluster import SlurmCluster
from runs import clean_env

pytestmark = pytest.mark.slow

PYTHON = sys.executable
# Ranks and job steps find `trainbox` and this venv's python first on PATH.
VENV_BIN = Path(PYTHON).parent
CLIENTS = Path(__file__).parents[2] / "examples" / "clients"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--standalone"]
# Every case, whatever its launcher: one thread per process, and no library goes online.
QUIET = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
# A 4-process run takes about 10 s on 2 cores; a world that never forms waits for ever.
TIMEOUT_S = 120
# A script that cannot start without a launcher fails on its first lines.
REFUSAL_S = 30
# Each client's STEPS.
STEPS = 24


def _exec_argv(client: str, out: Path, *overrides: str) -> list[str]:
    """`trainbox exec [OVERRIDES] -- python examples/clients/CLIENT.py OUT`."""
    script = CLIENTS / f"{client}.py"
    return ["trainbox", "exec", *overrides, "--", PYTHON, str(script), str(out)]


@dataclass(frozen=True)
class Finished:
    """How a run ended, and how long it took."""

    returncode: int
    stderr: str
    seconds: float
    # The Slurm cluster's queue and daemon logs, for a failed srun.
    diagnostics: str = ""


class Runs:
    """Runs each case at most once per module and remembers how it went, failures included."""

    def __init__(self, request: pytest.FixtureRequest, base: Path) -> None:
        self.request = request
        self.base = base
        self._done: dict[str, list[dict[str, Any]] | BaseException] = {}

    def env(self, extra: Mapping[str, str]) -> dict[str, str]:
        """A local launcher's environment: the test's, clean, with the venv first on PATH."""
        path = f"{VENV_BIN}:{os.environ.get('PATH', os.defpath)}"
        return clean_env(PATH=path, **QUIET, **extra)

    def slurm(self) -> SlurmCluster:
        """The session's Slurm cluster, started only when a Slurm case first needs it."""
        cluster: SlurmCluster = self.request.getfixturevalue("slurm_cluster")
        return cluster

    def records(self, case: Case) -> list[dict[str, Any]]:
        """Every rank's record, in file-name order; re-raises the case's skip or failure."""
        if case.id not in self._done:
            out = self.base / case.id
            try:
                finished = case.launcher.start(self, case, out)
                assert finished.returncode == 0, (
                    f"{case.id} exited {finished.returncode} after {finished.seconds:.1f}s\n"
                    f"{finished.diagnostics[-3000:]}\n--- stderr ---\n{finished.stderr[-5000:]}"
                )
                files = sorted(out.glob("rank-*.json"))
                self._done[case.id] = [json.loads(path.read_text()) | {"file": path.name}
                                       for path in files]  # fmt: skip
            # Skips and failures too, so that a broken launcher costs one run, not one per test.
            except (Exception, pytest.skip.Exception, pytest.fail.Exception) as exc:
                self._done[case.id] = exc
        result = self._done[case.id]
        if isinstance(result, BaseException):
            raise result
        return result


def run_local(argv: list[str], env: Mapping[str, str], *, timeout: float) -> Finished:
    """Run `argv` here; past `timeout`, kill it and everything it started, and fail."""
    started = time.monotonic()
    with subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:  # fmt: skip
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            _, stderr = proc.communicate(timeout=30)
            pytest.fail(f"{argv} still running after {timeout:.0f}s\n{stderr[-6000:]}")
    return Finished(proc.returncode, stderr, time.monotonic() - started)


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and all its descendants (torchrun's workers, Lightning's children)."""
    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(family, timeout=10)


@dataclass(frozen=True)
class Launcher:
    """A way to start a client behind `trainbox exec`, and the shape of the world it gives."""

    id: str
    nodes: int
    # Starts the case's client writing into the given folder; how it ended.
    start: Callable[[Runs, Case, Path], Finished]


def alone(runs: Runs, case: Case, out: Path) -> Finished:
    """`trainbox exec -- python CLIENT OUT`: one process, no launcher."""
    argv = _exec_argv(case.client, out)
    return run_local(argv, runs.env(case.env), timeout=TIMEOUT_S)


def torchrun(runs: Runs, case: Case, out: Path) -> Finished:
    """`torchrun --standalone --nproc-per-node=2 --no-python trainbox exec -- ...`."""
    argv = [*TORCHRUN, "--nproc-per-node=2", "--no-python", *_exec_argv(case.client, out)]
    return run_local(argv, runs.env(case.env), timeout=TIMEOUT_S)


def mpirun(runs: Runs, case: Case, out: Path) -> Finished:
    """`mpirun -np 2 trainbox exec -- ...`."""
    tiers.require_commands("mpirun")
    argv = [*MPIRUN, "-np", "2", *_exec_argv(case.client, out)]
    return run_local(argv, runs.env(case.env), timeout=TIMEOUT_S)


def srun(tasks_per_node: int, *overrides: str) -> Callable[[Runs, Case, Path], Finished]:
    """`srun -N2 --ntasks-per-node=K trainbox exec [OVERRIDES] -- ...` on the local cluster."""

    def start(runs: Runs, case: Case, out: Path) -> Finished:
        cluster = runs.slurm()
        name = f"exec-matrix-{case.id}"
        argv = ["srun", "-N2", f"--ntasks-per-node={tasks_per_node}", f"--job-name={name}",
                *_exec_argv(case.client, out, *overrides)]  # fmt: skip
        started = time.monotonic()
        try:
            # The cluster's env is the caller's minus Slurm's; srun hands it to every task.
            proc = cluster.run(argv, env=QUIET | case.env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # srun was killed; its job step would run on without this.
            cluster.run(["scancel", f"--name={name}"], timeout=30)
            cluster.wait_gone(name)
            pytest.fail(f"{argv} still running after {TIMEOUT_S}s\n{cluster.diagnostics()}")
        seconds = time.monotonic() - started
        diagnostics = cluster.diagnostics() if proc.returncode != 0 else ""
        return Finished(proc.returncode, proc.stderr, seconds, diagnostics)

    return start


ALONE = Launcher("alone", 1, alone)
TORCHRUN_2 = Launcher("torchrun-2", 1, torchrun)
SRUN_2X1 = Launcher("srun-2x1", 2, srun(1))
SRUN_2X2 = Launcher("srun-2x2", 2, srun(2))
# One task per node; trainbox starts each node's 2 workers under torchrun.
NODE_MODE = Launcher("srun-2x1-node-mode", 2, srun(1, "dist.procs_per_node=2"))
MPIRUN_2 = Launcher("mpirun-2", 1, mpirun)


@dataclass(frozen=True)
class Case:
    """One client under one launcher, with the world size its library must report."""

    client: str
    launcher: Launcher
    world_size: int
    # The client's own settings (Lightning's devices and num_nodes, the spawn count).
    env: dict[str, str] = field(default_factory=dict)
    # Names a second case of one client under one launcher (other settings in `env`).
    variant: str = ""

    @property
    def id(self) -> str:
        return "-".join(part for part in (self.client, self.variant, self.launcher.id) if part)


def lightning_like(client: str, shapes: list[tuple[Launcher, int]]) -> list[Case]:
    """Lightning and Fabric: `devices` x `num_nodes` must be the world the launcher starts.

    With no launcher, devices=2 asks the library to start its second process itself.
    """
    return [
        Case(client, launcher, devices * launcher.nodes,
             {"CLIENT_DEVICES": str(devices), "CLIENT_NODES": str(launcher.nodes)})
        for launcher, devices in shapes
    ]  # fmt: skip


CASES = [
    *lightning_like(
        "lightning_trainer",
        [(ALONE, 2), (TORCHRUN_2, 2), (SRUN_2X1, 1), (SRUN_2X2, 2), (NODE_MODE, 2), (MPIRUN_2, 2)],
    ),
    # Fabric finds its launcher through the Trainer's own cluster environments
    # (lightning.fabric.plugins.environments), so the Trainer's rows cover torchrun, srun one
    # task per node and mpirun; Fabric keeps its own launch with none, srun and node mode.
    *lightning_like("fabric_script", [(ALONE, 2), (SRUN_2X2, 2), (NODE_MODE, 2)]),
    # Accelerate reads the env:// variables trainbox exports: each launcher once. Node mode's
    # workers see what torchrun's do, which the Lightning and Fabric rows prove.
    Case("accelerate_script", ALONE, 1),
    Case("accelerate_script", TORCHRUN_2, 2),
    Case("accelerate_script", SRUN_2X1, 2),
    Case("accelerate_script", MPIRUN_2, 2),
    # Written for a launcher: with none it stops at once (its own test below). Its env://
    # reading is the plain one the shapes above already exercise: a local launcher of each kind.
    Case("tutorial_ddp", TORCHRUN_2, 2),
    Case("tutorial_ddp", MPIRUN_2, 2),
    # One process per node, which spawns CLIENT_PROCS workers: no launcher, or srun 1 per node.
    Case("mp_spawn_slurm", ALONE, 2, {"CLIENT_PROCS": "2"}),
    Case("mp_spawn_slurm", SRUN_2X1, 4, {"CLIENT_PROCS": "2"}),
    # Sharded training written for a launcher: FSDP2 as PyTorch's tutorial shows it, and
    # Accelerate's FSDP plugin. Their env:// reading is the tutorial's, so one shape suffices.
    Case("fsdp2_script", TORCHRUN_2, 2),
    Case("accelerate_script", TORCHRUN_2, 2, {"CLIENT_FSDP": "2"}, "fsdp"),
]
CLIENT_NAMES = sorted({case.client for case in CASES} | {"tutorial_ddp"})


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The module's results cache; each case runs on first use."""
    return Runs(request, tmp_path_factory.mktemp("exec_matrix"))


def test_every_client_has_cases() -> None:
    on_disk = sorted(path.stem for path in CLIENTS.glob("*.py"))
    assert on_disk == CLIENT_NAMES


@pytest.mark.parametrize("client", CLIENT_NAMES)
def test_the_client_imports_nothing_from_trainbox(client: str) -> None:
    tree = ast.parse((CLIENTS / f"{client}.py").read_text(encoding="utf-8"))
    modules = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names]  # fmt: skip
    modules += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert modules, "found no imports at all: the check would prove nothing"
    assert [name for name in modules if name.split(".")[0] == "trainbox"] == []


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_client_forms_one_world_of_the_launchers_size(runs: Runs, case: Case) -> None:
    records = runs.records(case)
    world = case.world_size
    assert len(records) == world, f"{len(records)} rank files for a world of {world}: {records}"
    assert sorted(record["rank"] for record in records) == list(range(world)), records
    assert all(record["file"] == f"rank-{record['rank']}.json" for record in records), records
    assert {record["client"] for record in records} == {case.client}
    assert [record["world_size"] for record in records] == [world] * world, records
    # Separate processes, each node's numbered 0..n-1.
    assert len({record["pid"] for record in records}) == world, records
    per_node = world // case.launcher.nodes
    expected_local = sorted(list(range(per_node)) * case.launcher.nodes)
    assert sorted(record["local_rank"] for record in records) == expected_local, records
    # One process group: every rank's all-reduce saw every rank.
    assert [record["rank_sum"] for record in records] == [world * (world - 1) / 2] * world
    assert [record["steps"] for record in records] == [STEPS] * world, records


def test_the_fsdp2_script_shards_each_block_over_the_world(runs: Runs) -> None:
    records = runs.records(Case("fsdp2_script", TORCHRUN_2, 2))
    # A 16 x 16 weight: each of the 2 ranks holds 8 rows of it, and its own checkpoint shard.
    assert [record["local_rows"] for record in records] == [8, 8], records
    checkpoint = runs.base / "fsdp2_script-torchrun-2" / "ckpt"
    assert sorted(path.name for path in checkpoint.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]


def test_accelerate_keeps_ddp_on_cpu_whatever_its_fsdp_plugin_says(runs: Runs) -> None:
    """Accelerate takes FSDP only on an accelerator device (its state.py): on CPU the plugin is
    kept and the model is wrapped in DDP, without a word. This pins that behaviour down, so the
    matrix's CPU row is read for what it proves: the world, not the sharding."""
    records = runs.records(Case("accelerate_script", TORCHRUN_2, 2, {"CLIENT_FSDP": "2"}, "fsdp"))
    assert {record["wrapped_as"] for record in records} == {"DistributedDataParallel"}, records


def test_tutorial_script_with_no_launcher_stops_at_once(tmp_path: Path) -> None:
    """With no launcher exec exports no LOCAL_RANK (Lightning reads one as "a launcher started
    every process"), so the tutorial's `int(os.environ["LOCAL_RANK"])` stops it at once."""
    env = clean_env(PATH=f"{VENV_BIN}:{os.environ.get('PATH', os.defpath)}", **QUIET)
    finished = run_local(_exec_argv("tutorial_ddp", tmp_path), env, timeout=REFUSAL_S)
    assert finished.returncode != 0, f"ran alone after all: {sorted(tmp_path.iterdir())}"
    assert "LOCAL_RANK" in finished.stderr, finished.stderr[-3000:]
    assert list(tmp_path.glob("rank-*.json")) == []
