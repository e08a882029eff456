"""What every fuzz property asserts of bad input, and how many examples each one runs.

Each property names its own example count, fixed so that CI's time stays known; set
`TRAINBOX_FUZZ_EXAMPLES=N` to run every property with N examples instead, e.g.
`TRAINBOX_FUZZ_EXAMPLES=2000 python -m pytest -n 0 tests/unit/test_fuzz_config.py`.
The commands run in this process (a new python with torch per example would cost seconds).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, settings

from trainbox import cli

EXAMPLES_VARIABLE = "TRAINBOX_FUZZ_EXAMPLES"


def fuzz(examples: int) -> settings:
    """Hypothesis settings for a fuzz property: `examples` in CI, or TRAINBOX_FUZZ_EXAMPLES."""
    return settings(
        max_examples=int(os.environ.get(EXAMPLES_VARIABLE, examples)),
        # Each property bounds its own time per example; hypothesis's deadline would flake.
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one in-process command did."""

    code: int
    stdout: str
    stderr: str
    seconds: float


def invoke(argv: Sequence[str], *, env: dict[str, str] | None = None) -> Outcome:
    """`trainbox ARGV` in this process, with only PATH, HOME and `env` in its environment."""
    base = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with (
        mock.patch.dict(os.environ, {**base, **(env or {})}, clear=True),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = cli.main(list(argv))
        except SystemExit as stop:  # argparse's own usage errors
            code = stop.code if isinstance(stop.code, int) else 2
    return Outcome(
        code=code, stdout=out.getvalue(), stderr=err.getvalue(), seconds=time.monotonic() - start
    )


def error_line(outcome: Outcome) -> str:
    """The one `trainbox: error:` line of a refusal (structured log lines may precede it)."""
    assert "Traceback" not in outcome.stderr, outcome.stderr
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("trainbox: error:")]
    assert len(errors) == 1, outcome.stderr
    return errors[0]


def assert_refused(outcome: Outcome, *, within_s: float, naming: str = "") -> None:
    """Exit 2 within `within_s`, one error line with a HINT (and `naming`), no traceback."""
    line = error_line(outcome)
    assert outcome.code == 2, (outcome.code, outcome.stderr)
    assert "HINT:" in line, line
    assert naming in line, (naming, line)
    assert outcome.seconds < within_s, (outcome.seconds, line)


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under `root` and its bytes (a link: where it points), to prove nothing moved."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = os.readlink(path).encode()
        elif path.is_file():
            found[str(path)] = path.read_bytes()
        else:
            found[str(path)] = b"<dir>"
    return found


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A fresh empty folder for one example (pytest's tmp_path is shared by all of them)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as name:
        yield Path(name)
