"""`trainbox exec` with no launcher: one process whose env:// just works (issue 19, item 2)."""

from __future__ import annotations

import json
import subprocess
import sys

from trainbox import launch

from runs import clean_env

SHOW_ENV = (
    "import json, os; print(json.dumps({k: os.environ[k] for k in"
    " ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')}))"
)


def exec_env() -> dict[str, str]:
    argv = [sys.executable, "-m", "trainbox", "exec", "--", sys.executable, "-c", SHOW_ENV]
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120)
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
