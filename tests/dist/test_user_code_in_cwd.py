"""User code in the current directory is found by `trainbox` as by `python -m trainbox`.

Issue 19, item 14: the console script's sys.path[0] is its bin directory, not the working
directory, so a `my_net.py` next to the config was found by one spelling and not the other.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runs import clean_env, summary

pytestmark = pytest.mark.slow

# Re-exports the built-in task under a name only the working directory holds.
USER_MODULE = "from trainbox.tasks.spirals import data, model\n"
CONSOLE_SCRIPT = Path(sys.executable).with_name("trainbox")
SPELLINGS = {
    "trainbox": [str(CONSOLE_SCRIPT)],
    "python -m trainbox": [sys.executable, "-m", "trainbox"],
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_module_in_the_working_directory_is_a_factory(tmp_path: Path, spelling: str) -> None:
    (tmp_path / "cwd_user_net.py").write_text(USER_MODULE)
    argv = [*SPELLINGS[spelling], "run", "run_dir=out", "train.max_steps=3", "train.eval_every=3",
            "model.factory=cwd_user_net:model", "data.factory=cwd_user_net:data"]  # fmt: skip
    proc = subprocess.run(
        argv,
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary(tmp_path / "out")["steps"] == 3
