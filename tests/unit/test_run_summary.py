"""The end-of-run summary: the greppable first line, what ran, and commands quoted for a shell."""

from __future__ import annotations

import shlex
from pathlib import Path

from trainbox.commands.run import lines

FINISHED = {"steps": 40, "val_metrics": {"val_loss": 0.51234, "val_accuracy": 0.98765},
            "final_loss": 0.4321, "train_seconds": 83.0, "samples_per_s": 12345.6,
            "world_size": 2, "launcher": "torchrun"}  # fmt: skip


def test_the_first_line_keeps_the_shape_scripts_grep_for() -> None:
    first = lines(FINISHED, Path("runs/x"))[0]
    assert first == "trained 40 steps: val_loss=0.5123 val_accuracy=0.9877 -> runs/x/summary.json"


def test_an_already_complete_run_says_so_first() -> None:
    first = lines({"steps": 40, "val_metrics": {}, "already_complete": True}, Path("r"))[0]
    assert first.startswith("already complete at step 40:")


def test_what_ran_is_one_readable_line() -> None:
    ran = lines(FINISHED, Path("runs/x"))[1]
    assert ran.split(":", 1)[1].strip() == (
        "final loss 0.4321, 1m23s of training, 12,346 samples/s, 2 process(es) under torchrun"
    )


def test_the_next_commands_survive_a_shell_with_spaces_in_the_path() -> None:
    text = "\n".join(lines(FINISHED, Path("runs/my run")))
    commands = [line.split(":", 1)[1].strip() for line in text.splitlines() if "trainbox " in line]
    assert [shlex.split(c)[:2] for c in commands] == [
        ["trainbox", "run"], ["trainbox", "eval"], ["trainbox", "predict"], ["trainbox", "report"],
    ]  # fmt: skip
    assert shlex.split(commands[0])[2:] == [
        "--config", "runs/my run/config.yaml", "run_dir=runs/my run", "train.max_steps=80",
    ]  # fmt: skip


def test_without_matplotlib_the_plot_line_says_how_to_get_it() -> None:
    """`trainbox report` needs the plot extra, which a plain install lacks."""
    plot = lines(FINISHED, Path("runs/x"), can_plot=False)[-1]
    assert plot == "  plot:          pip install 'trainbox[plot]', then: trainbox report runs/x"


def test_with_matplotlib_the_plot_line_is_the_command() -> None:
    assert (
        lines(FINISHED, Path("runs/x"), can_plot=True)[-1]
        == "  plot:          trainbox report runs/x"
    )
