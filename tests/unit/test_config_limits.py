"""A config's size, depth and value types have limits, so no file can hang or crash a rank.

Aliases count in full wherever they are used: a few hundred bytes must not expand to gigabytes.
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import pytest

from trainbox import cli, config
from trainbox.config import ConfigError
from trainbox.config.loading import MAX_DEPTH, MAX_VALUES


def bomb(levels: int) -> str:
    """`model.args` with `levels` anchors, each a list of nine aliases of the one before."""
    lines = ["model:", "  args:", "    x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels):
        lines.append(f"    x{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "model:\n  args:\n    x: " + "[" * depth + "]" * depth + "\n"


def run_config(tmp_path: Path, text: str) -> tuple[int, str, float]:
    """`trainbox config --config FILE` in this process: exit code, stderr and seconds taken."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    err = io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["config", "--config", str(path)])
    return code, err.getvalue(), time.monotonic() - start


def problems(path: str | None, *overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config.load(path, list(overrides))
    return caught.value.problems


def test_an_alias_bomb_is_refused_fast_naming_the_key_and_the_limit(tmp_path: Path) -> None:
    code, stderr, seconds = run_config(tmp_path, bomb(9))
    assert code == 2
    assert seconds < 1
    (line,) = stderr.splitlines()
    assert line.startswith("trainbox: error: config file ")
    assert f"model.args.x5 expands to more than {MAX_VALUES} values" in line
    assert "HINT:" in line


def test_deep_nesting_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    code, stderr, seconds = run_config(tmp_path, nested(5000))
    assert code == 2
    assert seconds < 1
    (line,) = stderr.splitlines()
    assert f"model.args.x is nested deeper than {MAX_DEPTH} levels (line 3, column 108)" in line
    assert "HINT:" in line


def test_nesting_up_to_the_limit_is_accepted(tmp_path: Path) -> None:
    # model.args.x is three levels deep, and the outermost list is x itself.
    path = tmp_path / "c.yaml"
    path.write_text(nested(MAX_DEPTH - 2))
    assert "x" in config.load(str(path), []).model.args
    path.write_text(nested(MAX_DEPTH - 1))
    assert "is nested deeper than" in problems(str(path))[0]


def test_aliases_within_the_limit_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(bomb(4))
    assert len(config.load(str(path), []).model.args["x3"]) == 9


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model:\n  args:\n    x: &a [*a]\n", "model.args.x[0] refers to itself"),
        ("model:\n  args:\n    x: &b {y: *b}\n", "model.args.x.y refers to itself"),
    ],
)
def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    (problem,) = problems(str(path))
    assert message in problem


def test_an_override_mapping_has_the_same_limits() -> None:
    deep = "[" * 5000 + "]" * 5000
    (problem,) = problems(None, f"model.args={{x: {deep}}}")
    assert f"model.args is nested deeper than {MAX_DEPTH} levels (line 1, column 104)" in problem
    assert deep not in problem


def test_a_dotted_override_has_the_depth_limit() -> None:
    dotted = "model.args." + ".".join(["a"] * 5000)
    (problem,) = problems(None, f"{dotted}=1")
    assert problem.startswith("model.args.a.a.a.")
    assert problem.endswith(f"a.a is nested deeper than {MAX_DEPTH} levels")
    assert len(problem) < 200


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("2020-01-01", "model.args.x is a date"),
        ("2020-01-01 10:00:00", "model.args.x is a date"),
        ("!!set {a, b}", "model.args.x is a set"),
        ("!!binary aGVsbG8=", "model.args.x is bytes"),
        ("!!omap [a: 1]", "model.args.x[0] is a tuple"),
        ("{1: a, b: 2}", "model.args.x has keys of more than one type"),
        ("{null: 1}", "model.args.x has a key null"),
    ],
)
def test_args_hold_plain_values_only(tmp_path: Path, value: str, shown: str) -> None:
    # A date made every checkpoint unloadable with weights_only; a set hashed differently on
    # each rank; mixed keys could not be fingerprinted.
    path = tmp_path / "c.yaml"
    path.write_text(f"model:\n  args:\n    x: {value}\n")
    (problem,) = problems(str(path))
    assert shown in problem


def test_plain_values_and_integer_keys_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "model:\n  args:\n    w: {0: 1.5, 1: 2}\n    n: null\n    t: [true, 1, 2.5, s, {}]\n"
    )
    assert config.load(str(path), []).model.args == {
        "w": {0: 1.5, 1: 2},
        "n": None,
        "t": [True, 1, 2.5, "s", {}],
    }


@pytest.mark.parametrize("text", [nested(5000), bomb(9)], ids=["deep", "bomb"])
def test_eval_reads_its_config_within_the_same_limits(tmp_path: Path, text: str) -> None:
    checkpoint = tmp_path / "step.pt"
    checkpoint.write_bytes(b"not read: the config is refused first")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    err = io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["eval", "--checkpoint", str(checkpoint), "--config", str(path)])
    # Two seconds: the first eval in a process also imports the inference modules.
    assert (code, time.monotonic() - start < 2) == (2, True)
    (line,) = err.getvalue().splitlines()
    assert f"config file {str(path)!r}: model.args.x" in line
    assert "HINT:" in line
