"""`--debug`: which variables it sets, that the user's own values win, and that exec hands them on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.process.debug import VARIABLES, debug_env

CPU_SET = {
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_CPP_LOG_LEVEL": "INFO",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,COLL,NET",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
    "TRAINBOX_LOG_LEVEL": "debug",
}

CASES = [
    # (user's environment, GPU visible, what --debug adds)
    ({}, False, CPU_SET),
    ({}, True, CPU_SET | {"CUDA_LAUNCH_BLOCKING": "1"}),
    ({"PATH": "/bin"}, False, CPU_SET),
    ({"NCCL_DEBUG": "WARN"}, False, {k: v for k, v in CPU_SET.items() if k != "NCCL_DEBUG"}),
    (
        {"TORCH_DISTRIBUTED_DEBUG": ""},
        False,
        {k: v for k, v in CPU_SET.items() if k != "TORCH_DISTRIBUTED_DEBUG"},
    ),
    ({"CUDA_LAUNCH_BLOCKING": "0"}, True, CPU_SET),
    (
        {"TRAINBOX_LOG_LEVEL": "warning", "NCCL_DEBUG_SUBSYS": "INIT"},
        False,
        {k: v for k, v in CPU_SET.items() if k not in ("TRAINBOX_LOG_LEVEL", "NCCL_DEBUG_SUBSYS")},
    ),
    ({name: "x" for name in CPU_SET} | {"CUDA_LAUNCH_BLOCKING": "x"}, True, {}),
]


@pytest.mark.parametrize(("env", "gpu", "expected"), CASES)
def test_debug_env_adds_only_what_the_user_left_unset(
    env: dict[str, str], gpu: bool, expected: dict[str, str]
) -> None:
    before = dict(env)
    assert debug_env(env, gpu=gpu) == expected
    assert env == before  # pure: the caller decides where the variables go


def test_every_variable_is_documented_in_the_troubleshooting_text() -> None:
    text = (Path(__file__).parents[2] / "docs" / "troubleshooting.md").read_text()
    assert [v.name for v in VARIABLES if f"`{v.name}" not in text] == []


def test_exec_debug_hands_the_variables_to_the_command_and_keeps_the_users() -> None:
    base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    code = "import os; print(os.environ['TORCH_DISTRIBUTED_DEBUG'], os.environ['NCCL_DEBUG'], 'CUDA_LAUNCH_BLOCKING' in os.environ)"
    proc = subprocess.run(
        [sys.executable, "-m", "trainbox", "exec", "--debug", "--", sys.executable, "-c", code],
        env=base | {"NCCL_DEBUG": "WARN"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # No GPU here: CUDA_LAUNCH_BLOCKING would only slow a CPU job down for nothing, and a CPU
    # script's DDP runs over gloo, where DETAIL crashes it.
    assert proc.stdout == "INFO WARN False\n"


def test_without_debug_nothing_is_added() -> None:
    base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    code = "import os; print(sorted(set(os.environ) & {'TORCH_DISTRIBUTED_DEBUG', 'NCCL_DEBUG', 'TRAINBOX_LOG_LEVEL'}))"
    proc = subprocess.run(
        [sys.executable, "-m", "trainbox", "exec", "--", sys.executable, "-c", code],
        env=base, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, "[]\n"), proc.stderr
