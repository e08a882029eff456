"""What a person sees running `trainbox run` in a terminal: one progress line with an ETA, redrawn
in place, with log lines above it and never spliced into it; then a summary whose commands work."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from runs import QUICK, clean_env, trainbox_argv

pytestmark = pytest.mark.slow

CLEAR = "\r\x1b[2K"
COLUMNS = 160
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run_on_a_terminal(run_dir: Path, nproc: int = 1) -> tuple[int, str]:
    """`trainbox run` with stdout and stderr on one pseudo-terminal; (exit code, all it wrote)."""
    leader, follower = os.openpty()
    # The terminal: 160 columns (tmux), where a wrapped line broke every redraw.
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
    argv = trainbox_argv(nproc, "run", f"run_dir={run_dir}", *QUICK)
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                          env=clean_env(TERM="xterm")) as proc:  # fmt: skip
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every holder of the follower end has closed it
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(timeout=300)
    os.close(leader)
    # The terminal turns each newline into CR LF; drop the CR so lines split plainly.
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return code, ANSI.sub("", text)


# Two ranks share the terminal under torchrun: rank 1's lines must not splice into rank 0's line.
@pytest.fixture(scope="module", params=[1, 2], ids=["1 process", "2 processes"])
def screen(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> str:
    code, output = _run_on_a_terminal(tmp_path_factory.mktemp("tty") / "run", request.param)
    assert code == 0, output[-3000:]
    return output


def _redraws(output: str) -> list[str]:
    """Each text the progress line was redrawn with (what follows a line clear, to the next)."""
    return [part.split("\n")[0] for part in output.split(CLEAR)[1:]]


def test_the_progress_line_shows_step_loss_speed_and_eta(screen: str) -> None:
    last = [text for text in _redraws(screen) if text.startswith("[")][-1]
    assert re.search(r"\] 40/40  loss \S+  samples/s \S+  .*ETA (\d+s|\d+m\d\ds)$", last), last


def test_the_progress_line_shows_the_validation_metrics_after_an_eval(screen: str) -> None:
    after_eval = [text for text in _redraws(screen) if re.search(r"\] [2-3]\d/40 ", text)]
    assert any("val_accuracy" in text for text in after_eval), after_eval


def test_no_per_step_records_while_the_progress_line_is_shown(screen: str) -> None:
    # QUICK logs every 5 steps: 8 step records that the progress line replaces.
    assert not re.search(r"\bstep\b.*data_wait_share", screen), screen[-3000:]


def test_log_lines_never_share_a_line_with_the_progress_line(screen: str) -> None:
    for row in screen.replace(CLEAR, "\n").splitlines():
        if "[#" in row or "[." in row:
            assert re.fullmatch(r"\[[#.]{20}\] \d+/40  .*ETA \S+", row.strip()), row


def test_the_progress_line_never_wraps(screen: str) -> None:
    drawn = [text for text in _redraws(screen) if text.startswith("[")]
    assert drawn
    assert max(len(text) for text in drawn) < COLUMNS


def test_console_floats_have_at_most_four_significant_digits(screen: str) -> None:
    assert not re.search(r"=\d*\.\d{5,}", screen), screen[-3000:]


def test_the_summary_s_next_commands_run_as_printed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = subprocess.run(trainbox_argv(1, "run", f"run_dir={run_dir}", *QUICK), env=clean_env(),
                           capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    printed = {
        line.split(":", 1)[0].strip(): shlex.split(line.split(":", 1)[1])
        for line in first.stdout.splitlines()
        if line.startswith("  ")
    }
    for name in ("train longer", "evaluate"):
        argv = [sys.executable, "-m", "trainbox", *printed[name][1:]]
        proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-2000:]}"
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 80
