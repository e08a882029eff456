"""The command line: exit codes, one-line errors with a HINT, doctor output, exec hand-over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trainbox import config
from trainbox.commands import run
from trainbox.preflight import node, nvml

from freeport import free_port
from launchcase import FIELDS, srun_task
from runs import clean_env

DOCTOR_KEYS = {*FIELDS, "gpus", "checks", "pinning"}


def trainbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m trainbox ARGS` with only `env` as launcher variables."""
    base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    return subprocess.run(
        [sys.executable, "-m", "trainbox", *args],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def trainbox_popen(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start `python -m trainbox ARGS` with only `env` as launcher variables."""
    base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    return subprocess.Popen(
        [sys.executable, "-m", "trainbox", *args],
        env=base | env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


BAD_ENVIRONMENTS = [
    ({"RANK": "1"}, "RANK='1' is set but WORLD_SIZE is not"),
    ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "h"}, "RANK=4 must be less than WORLD_SIZE=4"),
    ({"RANK": "zero", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK='zero' is not an integer"),
    ({"RANK": "-1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK=-1 must be at least 0"),
    (
        {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "auto"},
        "Kubeflow pod (PET_NNODES='2') but neither MASTER_ADDR nor PET_MASTER_ADDR is set",
    ),
    (
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        },
        "multi-node MPI job (OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_SIZE=2) but MASTER_ADDR",
    ),
    (
        srun_task(
            procid=0, localid=0, nodeid=0, tasks=1, nodes=1, tasks_per_node="1", nodelist="gpu[01-"
        ),
        "SLURM_STEP_NODELIST='gpu[01-' is not a valid Slurm hostlist",
    ),
]


@pytest.mark.parametrize(("env", "message"), BAD_ENVIRONMENTS)
@pytest.mark.parametrize("command", [["doctor"], ["doctor", "--json"], ["exec", "--", "true"]])
def test_bad_environment_exits_2_with_one_line_and_a_hint(
    env: dict[str, str], message: str, command: list[str]
) -> None:
    proc = trainbox(*command, env=env)
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("trainbox: error: ")
    assert message in line
    assert " HINT: " in line


def test_doctor_json_has_the_documented_fields() -> None:
    proc = trainbox("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report.keys() >= DOCTOR_KEYS
    assert (report["launcher"], report["world_size"]) == ("single", 1)
    assert all(check["status"] in ("ok", "warn", "fail", "skip") for check in report["checks"])
    assert set(report["pinning"]) >= {"cpus", "num_threads", "num_workers"}
    # A venv, not an image: no provenance to show (tests/container checks the image's).
    assert report["image"] == {"lock_sha256": None, "revision": None}


def test_doctor_json_without_nvidia_devices_has_no_driver_warning() -> None:
    """Where there is no GPU, no driver is what is expected: stdout JSON, stderr no warning."""
    if node.nvidia_devices():
        pytest.skip("this machine has an NVIDIA device: a missing driver there is worth a warning")
    proc = trainbox("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    checks = {check["name"]: check for check in json.loads(proc.stdout)["checks"]}
    logged = [json.loads(line) for line in proc.stderr.splitlines()]
    gpu_checks = {"driver", "cuda_version", "gpu_count"}
    assert [e for e in logged if e["event"] == "preflight" and e["name"] in gpu_checks] == []
    assert "NVML" not in proc.stderr
    if nvml.survey({}).driver_error is not None:
        assert checks["driver"]["status"] == "skip"
        assert "CPU mode" in checks["driver"]["message"]


def test_doctor_text_is_for_people() -> None:
    proc = trainbox("doctor", env={"TRAINBOX_LAUNCHER": "single"})
    assert proc.returncode == 0, proc.stderr
    assert "launcher: single" in proc.stdout.splitlines()


def test_logs_go_to_stderr_as_json_off_a_terminal() -> None:
    proc = trainbox("doctor", "--json")
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    launch = next(line for line in lines if line["event"] == "launch")
    assert (launch["rank"], launch["launcher"]) == (0, "single")


def test_exec_needs_a_command() -> None:
    proc = trainbox("exec")
    assert proc.returncode == 2
    assert "trainbox exec needs a command" in proc.stderr


def test_exec_of_a_missing_command_is_a_clear_error() -> None:
    proc = trainbox("exec", "--", "no-such-command-xyz")
    assert proc.returncode == 2
    assert "cannot run 'no-such-command-xyz'" in proc.stderr.splitlines()[-1]


def test_exec_hands_over_the_normalised_environment_and_exit_code() -> None:
    # Both tasks of the step: a rank's exec waits until every rank has reached the master.
    code = "import os, sys; print(os.environ['RANK'], os.environ['MASTER_ADDR']); sys.exit(7)"
    step = {"SLURM_STEP_RESV_PORTS": str(free_port())}
    procs = [
        trainbox_popen(
            "exec",
            "--",
            sys.executable,
            "-c",
            code,
            env=srun_task(
                procid=rank,
                localid=rank,
                nodeid=0,
                tasks=2,
                nodes=1,
                tasks_per_node="2",
                nodelist="localhost",
            )
            | step,
        )
        for rank in (0, 1)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [(proc.returncode, out) for proc, (out, _) in zip(procs, outputs, strict=True)] == [
        (7, "0 localhost\n"),
        (7, "1 localhost\n"),
    ]


def test_exec_takes_key_value_overrides_before_the_separator() -> None:
    code = "import os; print(os.environ['OMP_NUM_THREADS'])"
    proc = trainbox("exec", "pinning.num_threads=1", "--", sys.executable, "-c", code)
    assert (proc.returncode, proc.stdout) == (0, "1\n"), proc.stderr[-2000:]


def test_each_rank_logs_the_cpu_plan_it_pinned() -> None:
    # Without this line nobody can tell, from a pod's or a job's log, which CPU budget a rank
    # found (a cgroup quota, Slurm's CPUs per task) and how many threads it chose from it.
    proc = trainbox("exec", "pinning.num_threads=1", "--", sys.executable, "-c", "pass")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    pinned = next(line for line in lines if line["event"] == "pinned")
    assert pinned["num_threads"] == 1
    assert pinned["cpus"] == sorted(os.sched_getaffinity(0))
    assert pinned["env_set"] == ["OMP_NUM_THREADS", "MKL_NUM_THREADS"]
    assert {"budget", "mode", "num_workers", "notes"} <= pinned.keys()


def test_a_bad_exec_override_names_the_key() -> None:
    proc = trainbox("exec", "dist.procs_per_node=many", "--", "true")
    assert proc.returncode == 2
    assert "dist.procs_per_node" in proc.stderr.splitlines()[-1]
    assert "HINT:" in proc.stderr.splitlines()[-1]


def test_a_separator_inside_the_command_belongs_to_the_command() -> None:
    code = "import sys; print(sys.argv[1:])"
    proc = trainbox("exec", sys.executable, "-c", code, "--", "--lr", "1")
    assert (proc.returncode, proc.stdout) == (0, "['--', '--lr', '1']\n"), proc.stderr[-2000:]


def test_unknown_command_is_a_usage_error() -> None:
    assert trainbox("train").returncode == 2


def test_version() -> None:
    assert trainbox("--version").stdout.startswith("trainbox ")


def test_run_overrides_may_surround_the_config_option(tmp_path: Path) -> None:
    proc = trainbox("run", "train.max_step=1", "--config", str(tmp_path / "none.yaml"), "seed=x")
    assert proc.returncode == 2
    line = proc.stderr.splitlines()[-1]
    assert "cannot be read" in line
    assert "unknown key 'train.max_step'" in line
    assert "seed='x' must be an integer" in line


def test_unknown_options_are_usage_errors() -> None:
    assert trainbox("run", "--confg", "x").returncode == 2
    assert trainbox("doctor", "--bogus").returncode == 2
    assert trainbox("doctor", "seed=x").returncode == 2


# Issue 19, items 9 and 10: a bad run name or a non-finite float is exit 2 and one line, before
# anything is written (`name=` wrote into runs/ itself, `name=../../x` outside runs/, and a
# 300-character name raised OSError with a traceback).
@pytest.mark.parametrize(
    ("override", "culprit"),
    [
        ("name=", "name=''"),
        ("name=../../x", "name='../../x'"),
        ("name=" + "x" * 300, "(300 bytes)"),
        ("optim.lr=.nan", "optim.lr=nan must be a finite number"),
        ("optim.lr=.inf", "optim.lr=inf must be a finite number"),
    ],
)
def test_bad_names_and_non_finite_numbers_exit_2_before_writing(
    tmp_path: Path, override: str, culprit: str
) -> None:
    cwd = tmp_path / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "trainbox", "run", "train.max_steps=1", override],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("trainbox: error: ")
    assert culprit in line
    assert " HINT: " in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [
        Path("a"),
        Path("a/b"),
        Path("a/b/c"),
    ]


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("TRAINBOX_LOG_FORMAT", "xml", "json, console"),
        ("TRAINBOX_LOG_LEVEL", "verbose", "debug, info, warning, error"),
    ],
)
@pytest.mark.parametrize("command", [["doctor"], ["config"], ["run", "train.max_steps=1"]])
def test_bad_log_variables_exit_2_naming_the_variable(
    tmp_path: Path, variable: str, value: str, allowed: str, command: list[str]
) -> None:
    where = [f"run_dir={tmp_path / 'run'}"] if command[0] == "run" else []
    proc = trainbox(*command, *where, env={variable: value})
    assert (proc.returncode, proc.stdout) == (2, "")
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"trainbox: error: {variable}={value!r} must be one of {allowed}. ")
    assert " HINT: " in line


# Issue 19, item 11: a second --config used to win silently; it is refused.
@pytest.mark.parametrize("command", ["run", "doctor", "config"])
def test_a_second_config_file_is_refused(tmp_path: Path, command: str) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("seed: 1\n")
    second.write_text("seed: 2\n")
    given = ["--config", str(first), "--config", str(second)]
    proc = trainbox(command, *given, "train.max_steps=1", f"run_dir={tmp_path / 'run'}")
    assert (proc.returncode, proc.stdout) == (2, "")
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        f"trainbox: error: --config given twice ({str(first)!r}, {str(second)!r})"
    )
    assert " HINT: " in line


# Issue 19, item 15: `trainbox config` prints the resolved config with sources, as a dry run.
def test_config_command_prints_the_resolved_config_with_sources(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_steps: 10\n")
    proc = trainbox("config", "seed=3", "--config", str(path), "model.args={hidden: 32}")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert {"seed: 3  # override", "  max_steps: 10  # file", "    hidden: 32  # override"} <= set(
        lines
    )
    assert "  batch_size: 64  # default" in lines


def test_config_command_reports_a_bad_config_on_one_line() -> None:
    proc = trainbox("config", "train.max_step=5", "optim.lr=.nan")
    assert (proc.returncode, proc.stdout) == (2, "")
    (line,) = proc.stderr.splitlines()
    assert "unknown key 'train.max_step'" in line
    assert "optim.lr=nan must be a finite number" in line
    assert " HINT: " in line


def test_config_command_does_not_load_torch() -> None:
    code = (
        "import sys; from trainbox.cli import main; code = main(['config']);"
        " sys.exit(code or 10 * ('torch' in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_run_help_points_to_the_config_reference() -> None:
    proc = trainbox("run", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "trainbox config" in text
    assert "docs/configuration.md" in text


# What a process's Python does after `trainbox` returns, seen from an exit hook registered first
# (so it runs last): how many objects the collector had set aside for good.
_FROZEN_AT_EXIT = (
    "import atexit, gc, runpy, sys;"
    " atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr));"
    " sys.argv = ['trainbox', 'config'];"
)


def test_the_program_leaves_its_objects_out_of_the_exit_collections() -> None:
    code = _FROZEN_AT_EXIT + " runpy.run_module('trainbox', run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    frozen = int(proc.stderr.split("frozen ")[-1])
    assert frozen > 1000, proc.stderr


def test_main_called_in_process_freezes_nothing() -> None:
    code = _FROZEN_AT_EXIT + " from trainbox.cli import main; main(['config'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.split("frozen ")[-1].strip() == "0", proc.stderr


def test_the_console_script_is_the_program() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"trainbox": "trainbox.cli:program"}


class _Writes:
    """A stand-in stderr that keeps each write() call apart."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_an_error_line_reaches_stderr_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks share one stderr under torchrun, srun and mpirun, and print writes the newline
    in a second write(): two ranks failing at once would splice their lines together."""
    from trainbox import cli

    stderr = _Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert cli.main(["config", "train.max_steps=abc"]) == 2
    (call,) = [text for text in stderr.calls if "train.max_steps" in text]
    assert call.startswith("trainbox: error: ")
    assert call.endswith("\n")
    assert call.count("\n") == 1


FINISHED = {"steps": 40, "val_metrics": {"val_loss": 0.51234, "val_accuracy": 0.98765},
            "final_loss": 0.4321, "train_seconds": 83.0, "samples_per_s": 12345.6,
            "world_size": 2, "launcher": "torchrun"}  # fmt: skip


def printed(text: list[str]) -> dict[str, str]:
    """The summary's `  name: value` lines by name."""
    return {
        line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
        for line in text
        if line.startswith("  ")
    }


def test_the_summary_of_a_resumed_run_says_where_it_resumed() -> None:
    text = run.lines(FINISHED, Path("runs/x"), rerun=run.Rerun(resumed_from=30))
    assert printed(text)["ran"].startswith(
        "resumed from step 30 (10 more steps), final loss 0.4321"
    )


def test_the_summary_of_a_run_resumed_from_a_file_of_another_name_names_it() -> None:
    text = run.lines(FINISHED, Path("runs/x"), rerun=run.Rerun(resumed_from="/ckpt/model.pt"))
    assert printed(text)["ran"].startswith("resumed from /ckpt/model.pt, final loss")


def test_the_summary_of_a_run_from_step_0_says_nothing_of_resuming() -> None:
    assert "resumed" not in "\n".join(run.lines(FINISHED, Path("runs/x")))


def test_the_summary_of_a_run_without_a_validation_set_says_so() -> None:
    text = run.lines({**FINISHED, "val_metrics": {}}, Path("runs/x"))
    assert text[0] == "trained 40 steps: no validation set -> runs/x/summary.json"
    shown = printed(text)
    # eval reads the validation set, and predict's default split is it: neither would run.
    assert "trainbox eval" not in shown["evaluate"]
    assert "no validation set" in shown["evaluate"]
    assert shown["predict"].endswith("--output predictions.csv --split train")


def test_the_next_commands_carry_the_pythonpath_the_users_code_came_from() -> None:
    text = run.lines(FINISHED, Path("runs/x"), rerun=run.Rerun(pythonpath="examples/user_model"))
    shown = printed(text)
    for name in ("train longer", "evaluate", "predict"):
        assert shown[name].startswith("PYTHONPATH=examples/user_model trainbox "), shown[name]
    # report reads metrics.jsonl only: no user code to import.
    assert "PYTHONPATH" not in shown["plot"]


def test_train_longer_goes_on_from_the_newest_checkpoint_whatever_the_run_resumed_from() -> None:
    """config.yaml holds the run's train.resume: `never` would refuse the run's own checkpoints
    and a file would start again from that file."""
    for resume in ("never", "/ckpt/step-00000007.pt"):
        text = run.lines(FINISHED, Path("runs/x"), rerun=run.Rerun(resume=resume))
        assert printed(text)["train longer"].endswith("train.max_steps=80 train.resume=auto")
    assert printed(run.lines(FINISHED, Path("runs/x")))["train longer"].endswith(
        "train.max_steps=80"
    )


@pytest.mark.parametrize(
    ("origins", "pythonpath", "found"),
    [
        (["/w/examples/user_model/my_model"], "examples/user_model", True),
        (["/w/examples/user_model/my_model/__init__.py"], "/x:examples/user_model", True),
        (["/venv/lib/site-packages/my_model"], "examples/user_model", False),
        (["/w/examples/user_model_2/m.py"], "examples/user_model", False),
        (["/w/examples/user_model/my_model"], "", False),
        ([], "examples/user_model", False),
    ],
)
def test_code_from_pythonpath(origins: list[str], pythonpath: str, found: bool) -> None:
    assert run.code_from_pythonpath([Path(o) for o in origins], pythonpath, Path("/w")) is found


@pytest.mark.parametrize(
    ("source", "resumed"),
    [
        (None, None),
        ("runs/x/checkpoints/step-00000007.pt", 7),
        ("runs/x/checkpoints/step-00003000.dcp", 3000),
        ("/ckpt/model.pt", "/ckpt/model.pt"),
    ],
)
def test_resumed_from_reads_the_step_from_the_checkpoints_name(
    source: str | None, resumed: int | str | None
) -> None:
    assert run.resumed_from(source) == resumed


def test_rerun_reads_what_the_run_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model package found through PYTHONPATH, and run.json's resumed_from."""
    (tmp_path / "pkg" / "tiny_models").mkdir(parents=True)
    (tmp_path / "pkg" / "tiny_models" / "__init__.py").write_text("def model(): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(
        json.dumps({"resumed_from": str(run_dir / "checkpoints" / "step-00000014.pt")})
    )
    settings = config.load(None, [f"run_dir={run_dir}", "model.factory=tiny_models:model"])
    found = run.rerun_facts(settings, {"PYTHONPATH": "pkg"}, cwd=tmp_path)
    assert found == run.Rerun(pythonpath="pkg", resume="auto", resumed_from=14)
    builtin = config.load(None, [f"run_dir={tmp_path / 'none'}"])
    assert run.rerun_facts(builtin, {"PYTHONPATH": "pkg"}, cwd=tmp_path) == run.Rerun()


def test_in_process_recovery_outside_node_mode_says_it_recovers_by_restart(tmp_path: Path) -> None:
    # One process per rank has no keeper to hold a spare: the run must not look protected.
    proc = trainbox(
        "run", "dist.recovery=in_process", "train.max_steps=1", f"run_dir={tmp_path / 'run'}"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line)["event"] for line in proc.stderr.splitlines() if line[:1] == "{"]
    assert any(event.startswith("dist.recovery=in_process needs node mode") for event in events)
