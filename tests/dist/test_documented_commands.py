"""Every command the README and the examples show runs, or names the test that runs it
(issue 19, item 2: the documented `trainbox exec -- python examples/api_script.py` failed).

Commands are read from README.md's and examples/**/README.md's sh blocks, the examples' module
docstrings and their config.yaml comments. Each must have an entry in COVERAGE, so a new
documented command fails here until it is run or accounted for:

- Quick: run here, in a sandbox directory, as the documented words with only additions (fewer
  steps, a free port) and the substitutions listed (a temporary path for /tmp/tab);
- Elsewhere: needs Slurm, MPI, a container runtime or a cluster, or another test runs that very
  launch already; names the test that runs it;
- Environment: an `export` that sets up the lines after it (their quick forms carry it).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainbox.config import Config, leaves

from freeport import free_port
from runs import clean_env

ROOT = Path(__file__).parents[2]
# The words a documented command line starts with.
COMMAND_START = re.compile(
    r"^(trainbox|python|torchrun|srun|sbatch|mpirun|docker|kubectl|pip|export|\./scripts/|[A-Z_]+=)"
)
STEPS = "train.max_steps=20 train.eval_every=10 train.ckpt_every=10 train.log_every=10"


@dataclass(frozen=True, kw_only=True)
class Quick:
    """Run here: `line` in the sandbox ({tmp}: the sandbox, {port}: a free port)."""

    # A shell line: the documented words in order, with additions only.
    line: str
    # Documented text -> what the quick form says instead (paths outside the sandbox).
    subs: dict[str, str] = field(default_factory=dict)
    # Run first, not part of the documented command (a copy to build from).
    setup: str = ""
    # Run from the repository root instead of the sandbox (the scripts cd there themselves).
    in_repo: bool = False


@dataclass(frozen=True, kw_only=True)
class Elsewhere:
    """Run by another test: one with tools this tier does not have, or one running it anyway."""

    # tests/...py::test_name
    test: str


@dataclass(frozen=True, kw_only=True)
class Environment:
    """An `export` line: not a command of its own."""

    # Which quick forms carry it.
    note: str


USER_MODEL_CONFIG = "--config examples/user_model/config.yaml"
# The example's package and config under torchrun with 2 processes: the documented line with a
# few more overrides. The plain torchrun line (no --standalone) still runs here.
EXAMPLE_UNDER_TORCHRUN = (
    "tests/dist/test_example_guarantees.py::test_it_runs_under_torchrun_with_its_own_steps"
)
MATRIX = "tests/launchers/test_train_matrix.py::test_trains_all_steps_under_the_launcher"
OWN_SCRIPT = "tests/launchers/test_own_script.py::test_script_trains_with_the_launchers_world_size"
EXEC_MATRIX = (
    "tests/launchers/test_exec_matrix.py::test_the_client_forms_one_world_of_the_launchers_size"
)
COVERAGE: dict[str, Quick | Elsewhere | Environment] = {
    # README.md
    "./scripts/example": Quick(line=f"./scripts/example run_dir={{tmp}}/scripts-example {STEPS}", in_repo=True),
    "./scripts/test": Elsewhere(test=".ci/run"),
    "trainbox run": Quick(line=f"trainbox run {STEPS}"),
    "trainbox config train.max_steps=200": Quick(line="trainbox config train.max_steps=200"),
    "torchrun --nproc-per-node 2 -m trainbox run": Quick(
        line=f"torchrun --master-port {{port}} --nproc-per-node 2 -m trainbox run run_dir=runs/torchrun {STEPS}"
    ),
    "srun -N2 --ntasks-per-node=4 trainbox run --config my.yaml train.max_steps=10000": Elsewhere(test=MATRIX),
    "mpirun -np 8 -x MASTER_ADDR=$(hostname) trainbox run --config my.yaml": Elsewhere(test=MATRIX),
    "docker build -t trainbox:gpu .": Elsewhere(
        test="tests/container/test_image.py::test_the_default_command_trains_the_built_in_task_as_non_root"
    ),
    "docker run --rm --gpus all --shm-size=8g trainbox:gpu": Elsewhere(
        test="tests/container/test_image.py::test_the_default_command_trains_the_built_in_task_as_non_root"
    ),
    "srun -N4 --ntasks-per-node=8 trainbox doctor --network": Elsewhere(
        test="tests/launchers/test_network_launchers.py::test_two_slurm_nodes_form_one_ring_per_local_rank"
    ),
    "kubectl apply -k k8s/": Elsewhere(
        test="tests/manifests/test_k8s_manifests.py::test_kustomization_or_its_alternative_lists_each_manifest"
    ),
    # What slurm/train-per-gpu.sbatch runs on each task (apptainer/README.md shows it too).
    'srun apptainer run --nv --bind "$PWD/runs:/runs" train.sif run run_dir=/runs/my-run': Elsewhere(
        test="tests/container/test_slurm_scripts.py::test_sbatch_script_trains_in_the_image"
    ),
    "sbatch slurm/train-per-gpu.sbatch": Elsewhere(
        test="tests/container/test_slurm_scripts.py::test_sbatch_script_trains_in_the_image"
    ),
    "trainbox report runs/example": Quick(line="trainbox report runs/example"),
    "trainbox hang runs/example": Elsewhere(
        test="tests/dist/test_hangs.py::test_trainbox_hang_names_the_stalled_rank_and_where_the_other_waited"
    ),
    "trainbox eval --checkpoint runs/example": Quick(line="trainbox eval --checkpoint runs/example"),
    "trainbox predict --checkpoint runs/example --output preds.csv": Quick(
        line="trainbox predict --checkpoint runs/example --output preds.csv"
    ),
    f"PYTHONPATH=examples/user_model trainbox run {USER_MODEL_CONFIG}": Quick(
        line=f"PYTHONPATH=examples/user_model trainbox run {USER_MODEL_CONFIG} run_dir=runs/user {STEPS}"
    ),
    "srun -N2 --ntasks-per-node=4 trainbox exec -- python train.py": Elsewhere(test=OWN_SCRIPT),
    # examples/user_model/README.md and config.yaml
    f"pip install ./examples/user_model && trainbox run {USER_MODEL_CONFIG}": Quick(
        # Installed into a directory of the sandbox's, from a copy: the venv and the source
        # tree stay as they were (pip leaves build/ and *.egg-info beside the sources).
        line=f"pip install --quiet --no-deps --target {{tmp}}/site {{tmp}}/user_model-src &&"
        f" PYTHONPATH={{tmp}}/site trainbox run {USER_MODEL_CONFIG} run_dir=runs/installed {STEPS}",
        subs={"./examples/user_model": "{tmp}/user_model-src"},
        setup="cp -r examples/user_model {tmp}/user_model-src",
    ),
    "docker run --rm -v $PWD/examples/user_model:/opt/user -e PYTHONPATH=/opt/user trainbox run"
    " --config /opt/user/config.yaml": Elsewhere(
        # The image's `trainbox run`; the package on PYTHONPATH is the line below it, run here.
        test="tests/container/test_image.py::test_the_default_command_trains_the_built_in_task_as_non_root"
    ),
    # examples/locator/README.md and config.yaml (the run first: eval and predict read it)
    "PYTHONPATH=examples/locator trainbox run --config examples/locator/config.yaml": Quick(
        line=f"PYTHONPATH=examples/locator trainbox run --config examples/locator/config.yaml {STEPS}"
    ),
    "PYTHONPATH=examples/locator torchrun --nproc-per-node 2 -m trainbox run --config examples/locator/config.yaml": Elsewhere(test=EXAMPLE_UNDER_TORCHRUN),
    "PYTHONPATH=examples/locator trainbox eval --checkpoint runs/locator": Quick(
        line="PYTHONPATH=examples/locator trainbox eval --checkpoint runs/locator"
    ),
    "PYTHONPATH=examples/locator trainbox predict --checkpoint runs/locator --output tiles.csv": Quick(
        line="PYTHONPATH=examples/locator trainbox predict --checkpoint runs/locator --output tiles.csv"
    ),
    # examples/tabular_dict/README.md and config.yaml (the run first: eval and predict read it)
    "PYTHONPATH=examples/tabular_dict trainbox run --config examples/tabular_dict/config.yaml": Quick(
        line=f"PYTHONPATH=examples/tabular_dict trainbox run --config examples/tabular_dict/config.yaml {STEPS}"
    ),
    "PYTHONPATH=examples/tabular_dict torchrun --nproc-per-node 2 -m trainbox run --config examples/tabular_dict/config.yaml": Elsewhere(test=EXAMPLE_UNDER_TORCHRUN),
    "PYTHONPATH=examples/tabular_dict trainbox eval --checkpoint runs/churn": Quick(
        line="PYTHONPATH=examples/tabular_dict trainbox eval --checkpoint runs/churn"
    ),
    "PYTHONPATH=examples/tabular_dict trainbox predict --checkpoint runs/churn --output churn.csv": Quick(
        line="PYTHONPATH=examples/tabular_dict trainbox predict --checkpoint runs/churn --output churn.csv"
    ),
    # examples/masked_autoencoder/README.md and its configs, in order: the fine-tune reads the
    # pretrain run, predict the fine-tune
    "PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/pretrain.yaml": Quick(line=f"PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/pretrain.yaml {STEPS}"),
    "PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/finetune.yaml": Quick(line=f"PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/finetune.yaml {STEPS}"),
    "PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/finetune.yaml train.init_from= run_dir=runs/mae-random": Quick(
        line=f"PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/finetune.yaml train.init_from= run_dir=runs/mae-random {STEPS}"
    ),
    "PYTHONPATH=examples/masked_autoencoder trainbox predict --checkpoint runs/mae-finetune --output predictions.csv": Quick(
        line="PYTHONPATH=examples/masked_autoencoder trainbox predict --checkpoint runs/mae-finetune --output predictions.csv"
    ),
    # examples/api_script.py
    "export PYTHONPATH=examples/user_model": Environment(note="the api_script lines below set it"),
    "trainbox exec -- python examples/api_script.py": Quick(
        line=f"PYTHONPATH=examples/user_model trainbox exec -- python examples/api_script.py run_dir=runs/api {STEPS}"
    ),
    "torchrun --nproc-per-node 2 examples/api_script.py": Quick(
        line="PYTHONPATH=examples/user_model torchrun --master-port {port} --nproc-per-node 2"
        f" examples/api_script.py run_dir=runs/api-torchrun {STEPS}"
    ),
    "srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/api_script.py": Elsewhere(
        test="tests/launchers/test_api_script.py::test_under_srun"
    ),
    f"trainbox run {USER_MODEL_CONFIG}": Quick(
        line=f"PYTHONPATH=examples/user_model trainbox run {USER_MODEL_CONFIG} run_dir=runs/twin {STEPS}"
    ),
    # examples/own_script.py
    "torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/own_script.py OUT": Quick(
        line="torchrun --master-port {port} --nproc-per-node 2 --no-python trainbox exec -- python"
        " examples/own_script.py own.json",
        subs={"OUT": "own.json"},
    ),
    "srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/own_script.py OUT": Elsewhere(test=OWN_SCRIPT),
    "mpirun -np 2 trainbox exec -- python examples/own_script.py OUT": Elsewhere(test=OWN_SCRIPT),
    "mpirun -np 8 -x MASTER_ADDR=$(hostname) trainbox exec -- python examples/own_script.py OUT": Elsewhere(
        test=OWN_SCRIPT
    ),
    # examples/tabular/make_csv.py and config.yaml
    "python examples/tabular/make_csv.py /tmp/tab": Quick(
        line="python examples/tabular/make_csv.py {tmp}/tab", subs={"/tmp/tab": "{tmp}/tab"}
    ),
    "trainbox run --config examples/tabular/config.yaml data.args.train_csv=/tmp/tab/train.csv"
    " data.args.val_csv=/tmp/tab/val.csv": Quick(
        line="trainbox run --config examples/tabular/config.yaml data.args.train_csv={tmp}/tab/train.csv"
        f" data.args.val_csv={{tmp}}/tab/val.csv run_dir=runs/tabular {STEPS}",
        subs={"/tmp/tab": "{tmp}/tab"},
    ),
    # examples/clients/README.md
    "CLIENT_DEVICES=2 trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 CLIENT_NODES=2 srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/clients/fabric_script.py OUT": Elsewhere(test=EXEC_MATRIX),
    "mpirun -np 2 trainbox exec -- python examples/clients/accelerate_script.py OUT": Elsewhere(test=EXEC_MATRIX),
    "torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/clients/tutorial_ddp.py OUT": Elsewhere(test=EXEC_MATRIX),
    "srun -N2 --ntasks-per-node=1 trainbox exec -- python examples/clients/mp_spawn_slurm.py OUT": Elsewhere(test=EXEC_MATRIX),
    "torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/clients/fsdp2_script.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_FSDP=2 torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/clients/accelerate_script.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_NODES=2 srun -N2 --ntasks-per-node=1 trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 CLIENT_NODES=2 srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 CLIENT_NODES=2 srun -N2 --ntasks-per-node=1 trainbox exec dist.procs_per_node=2 -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 mpirun -np 2 trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
}  # fmt: skip


def normalise(line: str) -> str:
    """A command as documented, without its comment and `[key=value ...]` placeholders."""
    line = re.sub(r"\s#\s.*$", "", line)
    line = re.sub(r"\s\[[^\]]*\]", "", line)
    return " ".join(line.split())


def joined(lines: list[str]) -> list[str]:
    """Lines with shell continuations (a trailing backslash) joined."""
    out: list[str] = []
    carry = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            carry += line.rstrip()[:-1] + " "
            continue
        out.append(carry + line)
        carry = ""
    return out


def markdown_commands(path: Path) -> list[str]:
    blocks = re.findall(r"```(?:sh|bash|shell|console)\n(.*?)```", path.read_text(), re.S)
    lines = joined([line for block in blocks for line in block.splitlines()])
    return [line.strip() for line in lines if COMMAND_START.match(line.strip())]


def docstring_commands(path: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    # Indented lines are the examples; prose starts at the margin.
    lines = joined([line for line in doc.splitlines() if line.startswith("    ")])
    return [line.strip() for line in lines if COMMAND_START.match(line.strip())]


def comment_commands(path: Path) -> list[str]:
    lines = joined([line[1:] for line in path.read_text().splitlines() if line.startswith("#   ")])
    return [line.strip() for line in lines if COMMAND_START.match(line.strip())]


def documented() -> dict[str, list[str]]:
    """Every documented command (normalised) and where it is written."""
    sources = [(ROOT / "README.md", markdown_commands)]
    sources += [
        (path, markdown_commands) for path in sorted((ROOT / "examples").rglob("README.md"))
    ]
    sources += [(path, docstring_commands) for path in sorted((ROOT / "examples").rglob("*.py"))]
    sources += [(path, comment_commands) for path in sorted((ROOT / "examples").rglob("*.yaml"))]
    found: dict[str, list[str]] = {}
    for path, read in sources:
        for line in read(path):
            found.setdefault(normalise(line), []).append(str(path.relative_to(ROOT)))
    return found


def is_subsequence(words: list[str], within: list[str]) -> bool:
    rest = iter(within)
    return all(word in rest for word in words)


# A dotted config key in prose or code: `train.loss`, `data.args.noise=0.8`.
CONFIG_KEY = re.compile(
    r"(?<![\w./-])(?:model|data|train|optim|dist|preflight|pinning)\.[a-z_]+(?:\.[a-z_]+)*"
)
# Mappings whose entries are the factory's own arguments, not config keys.
FREE = ("model.args.", "data.args.", "optim.args.", "optim.schedule_args.")
# File names look like keys: train.py, data.csv, train.sif.
FILE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".jsonl", ".csv", ".md", ".sh", ".pt", ".png")
FILE_SUFFIXES += (".sif", ".def")  # Apptainer's image and its definition


def unknown_keys(text: str, known: set[str]) -> set[str]:
    """Config keys `text` names that the config does not have (sub-keys of *.args are free)."""
    named = set(CONFIG_KEY.findall(text))
    return {
        key
        for key in named
        if key not in known and not key.startswith(FREE) and not key.endswith(FILE_SUFFIXES)
    }


def test_unknown_keys_are_found() -> None:
    # The check below would pass on anything if the pattern found nothing.
    text = "With `data.num_workers > 0`; `train.loss`; `data.args.noise=0.8`; train.py; x.data.y"
    assert unknown_keys(text, {"train.loss"}) == {"data.num_workers"}


def test_the_readmes_name_only_config_keys_that_exist() -> None:
    known = {key for key, *_ in leaves(Config, "")}
    documents = [ROOT / "README.md", *sorted((ROOT / "examples").rglob("*.md"))]
    found = {
        str(path.relative_to(ROOT)): unknown_keys(path.read_text(), known) for path in documents
    }
    assert not {path: keys for path, keys in found.items() if keys}


def test_every_documented_command_is_accounted_for() -> None:
    found = documented()
    missing = {command: where for command, where in found.items() if command not in COVERAGE}
    assert not missing, f"documented commands with no entry in COVERAGE: {missing}"
    stale = [command for command in COVERAGE if command not in found]
    assert not stale, f"COVERAGE entries no document shows any more: {stale}"


@pytest.mark.parametrize("command", [c for c, how in COVERAGE.items() if isinstance(how, Quick)])
def test_a_quick_form_is_the_documented_command_with_additions(command: str) -> None:
    how = COVERAGE[command]
    assert isinstance(how, Quick)
    expected = command
    for old, new in how.subs.items():
        expected = expected.replace(old, new)
    assert is_subsequence(shlex.split(expected), shlex.split(how.line)), how.line


@pytest.mark.parametrize(
    "command", [c for c, how in COVERAGE.items() if isinstance(how, Elsewhere)]
)
def test_the_test_named_for_a_command_exists(command: str) -> None:
    how = COVERAGE[command]
    assert isinstance(how, Elsewhere)
    path, _, name = how.test.partition("::")
    assert (ROOT / path).is_file(), how.test
    if name:
        assert f"def {name}(" in (ROOT / path).read_text(), how.test


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory where `examples/` is the repository's: runs/ lands here."""
    directory = tmp_path_factory.mktemp("documented")
    (directory / "examples").symlink_to(ROOT / "examples")
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, how in COVERAGE.items() if isinstance(how, Quick)])
def test_the_documented_command_runs(command: str, sandbox: Path) -> None:
    # In COVERAGE's order: report, eval and predict read the run `trainbox run` wrote.
    how = COVERAGE[command]
    assert isinstance(how, Quick)
    fill = {"{tmp}": str(sandbox), "{port}": str(free_port())}
    line, setup = how.line, how.setup
    for key, value in fill.items():
        line, setup = line.replace(key, value), setup.replace(key, value)
    # The venv's trainbox, torchrun and python first, as in an activated venv.
    env = clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if setup:
        subprocess.run(["bash", "-c", setup], cwd=sandbox, env=env, check=True, timeout=60)
    proc = subprocess.run(["bash", "-c", line], cwd=ROOT if how.in_repo else sandbox, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
