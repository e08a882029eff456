"""`trainbox exec` with no launcher: one process whose env:// just works, as plain python would run.

No launcher means no outside world: the script sees a world of one it can join, and libraries
that start their own processes (Lightning, Fabric) still do, as they would under plain python.
"""

from __future__ import annotations

import json
import subprocess
import sys

from trainbox import launch

from runs import clean_env

SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"
# Their presence tells Lightning and Fabric that an outside launcher started every process.
PLACEMENT = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK")
SHOW_THREADS = (
    "import json, os, torch; print(json.dumps({'omp': os.environ.get('OMP_NUM_THREADS'),"
    " 'torch': torch.get_num_threads(), 'cpus': len(os.sched_getaffinity(0)),"
    " 'workers': os.environ.get('TRAINBOX_NUM_WORKERS')}))"
)


def exec_env(
    *before: str, env: dict[str, str] | None = None, code: str = SHOW_ENV
) -> dict[str, str]:
    argv = [sys.executable, "-m", "trainbox", "exec", *before, "--", sys.executable, "-c", code]
    env = clean_env() if env is None else env
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_exec_without_a_launcher_exports_a_real_master_port() -> None:
    env = exec_env()
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "1", "127.0.0.1")
    assert 0 < int(env["MASTER_PORT"]) < 65536


def test_the_exported_variables_are_a_launch_trainbox_itself_accepts() -> None:
    # A script behind exec that calls trainbox.init_distributed detects them again.
    context = launch.detect(exec_env(), launch.HostFacts())
    assert (context.rank, context.world_size) == (0, 1)


def test_init_distributed_works_behind_exec_without_a_launcher() -> None:
    code = (
        "import trainbox, torch.distributed as d\n"
        "with trainbox.init_distributed() as s: print('world', d.get_world_size())"
    )
    argv = [sys.executable, "-m", "trainbox", "exec", "--", sys.executable, "-c", code]
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.splitlines()[-1:]) == (0, ["world 1"]), proc.stderr[-2000:]


def test_exec_without_a_launcher_sets_no_placement_variables() -> None:
    # With LOCAL_RANK set, Lightning `devices=2` waited forever for a second process it
    # believed an outside launcher had started; unset, it starts that process itself.
    assert [name for name in PLACEMENT if name in exec_env()] == []


def test_stale_placement_variables_do_not_reach_the_command() -> None:
    env = exec_env(env=clean_env(LOCAL_RANK="3", LOCAL_WORLD_SIZE="4"))
    assert [name for name in PLACEMENT if name in env] == []


def test_an_exec_process_gets_its_whole_cpu_budget_as_threads() -> None:
    env = {k: v for k, v in clean_env().items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    seen = exec_env(env=env, code=SHOW_THREADS)
    cpus = seen["cpus"]
    assert (seen["omp"], seen["torch"]) == (str(cpus), cpus)


def test_exec_exports_the_worker_count_it_would_choose() -> None:
    env = {k: v for k, v in clean_env().items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    seen = exec_env("pinning.num_workers=3", env=env, code=SHOW_THREADS)
    assert seen["workers"] == "3"


def test_a_thread_count_in_the_config_still_wins() -> None:
    env = {k: v for k, v in clean_env().items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    seen = exec_env("pinning.num_threads=1", env=env, code=SHOW_THREADS)
    assert (seen["omp"], seen["torch"]) == ("1", 1)


def test_the_log_says_which_world_exec_exported_and_from_what() -> None:
    argv = [sys.executable, "-m", "trainbox", "exec", "--", sys.executable, "-c", "pass"]
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    (exported,) = [line for line in lines if line["event"] == "exported"]
    assert (exported["from"], exported["world_size"]) == ("single", 1)
    assert exported["variables"]["WORLD_SIZE"] == "1"
    assert "LOCAL_RANK" not in exported["variables"]
