"""Messages about the files eval, predict and report are given say what is really wrong, on
one line; predict's own line says only what happened."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.commands import predict
from trainbox.errors import UsageError
from trainbox.infer import locate

from runs import clean_env


def said(*args: str, cwd: Path) -> list[str]:
    """The lines a trainbox command printed to stderr that are not log lines; exit 2 expected."""
    proc = subprocess.run([sys.executable, "-m", "trainbox", *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if not line.startswith("{")]


@pytest.mark.parametrize("command", ["eval", "predict"])
def test_a_garbage_checkpoint_is_one_line(tmp_path: Path, command: str) -> None:
    (tmp_path / "bad.pt").write_bytes(b"garbage\n" * 10)
    output = ["--output", "p.csv"] if command == "predict" else []
    lines = said(command, "--checkpoint", "bad.pt", *output, cwd=tmp_path)
    assert len(lines) == 1, lines
    assert "--checkpoint 'bad.pt' is not a checkpoint torch can read (UnpicklingError" in lines[0]
    assert "HINT:" in lines[0]


def test_report_of_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    lines = said("report", "metrics.jsonl", cwd=tmp_path)
    assert lines[-1].startswith("trainbox: error: metrics.jsonl is a file, not a run directory")


def test_an_output_that_is_a_directory_names_a_file_in_it_not_force(tmp_path: Path) -> None:
    for name in ("outdir", "preds.csv"):
        (tmp_path / name).mkdir()
        problems = [
            *locate.early_problems(tmp_path / "x.pt", tmp_path / name, predict=True),
            *locate.destination_problems(tmp_path / name, force=True),
        ]
        texts = {p.text for p in problems if "--output" in p.text}
        hints = {p.hint for p in problems if "--output" in p.text}
        assert texts == {f"--output {str(tmp_path / name)!r} is a directory"}
        assert all("--force" not in hint for hint in hints)
        assert any(f"{tmp_path / name}/predictions.csv" in hint for hint in hints)


def test_a_latest_link_to_a_deleted_checkpoint_says_so(tmp_path: Path) -> None:
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "latest").symlink_to("step-00000040.pt")
    for given in (tmp_path / "run", checkpoints / "latest"):
        problem = locate.checkpoint_problem(locate.checkpoint_path(str(given)))
        assert problem is not None
        assert problem.text == (
            f"--checkpoint {str(checkpoints / 'latest')!r} links to step-00000040.pt,"
            " which does not exist (deleted?)"
        )


def test_problems_are_one_line_whatever_they_quote() -> None:
    from trainbox.distributed.consensus import Problem, combined

    error = combined([Problem(text="torch said:\nline two\n\nline three", hint="do\nthis")])
    assert isinstance(error, UsageError)
    assert "\n" not in error.line()


PREDICTED = {"rows": 1001, "split": "val", "checkpoint": "runs/x/checkpoints/step-00000040.pt",
             "step": 40, "chunks": 2, "reused": 0, "output": "preds.csv"}  # fmt: skip


def test_a_prediction_that_reused_nothing_does_not_say_so() -> None:
    assert predict.line(PREDICTED) == (
        "predicted 1001 rows of the val split with step-00000040.pt (step 40) -> preds.csv"
    )


def test_a_prediction_that_reused_parts_says_how_many() -> None:
    assert predict.line({**PREDICTED, "reused": 1}) == (
        "predicted 1001 rows of the val split with step-00000040.pt (step 40), reusing 1 of 2"
        " parts -> preds.csv"
    )
