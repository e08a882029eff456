"""Over random overrides and launch environments, the CLI never shows a traceback.

Every outcome is exit 0, 2, 3 or 4; an error is one `trainbox: error:` line with a HINT. The
commands run in this process for speed, with two boundaries replaced and why:
- name resolution answers from a fixed table, so random host names send no DNS queries;
- `run` stops where training would begin (the trainer, pinning and node-mode hand-off have
  their own tests): what is under test here is everything that reads user input first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import socket
import typing
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainbox import cli
from trainbox.config import Config
from trainbox.train.resume.run_dir import TrainSummary

from launchenv import ENVIRONMENTS, near_real_environments

RESOLVABLE = {"127.0.0.1", "localhost", "::1"}
EXIT_CODES = {0, 2, 3, 4}


def dotted_keys(kind: type, prefix: str = "") -> list[str]:
    """Every config key, as an override names it."""
    hints = typing.get_type_hints(kind)
    keys = []
    for field in dataclasses.fields(kind):
        inner = hints[field.name]
        if dataclasses.is_dataclass(inner):
            keys += dotted_keys(inner, f"{prefix}{field.name}.")
        else:
            keys.append(f"{prefix}{field.name}")
    return keys


KEYS = st.one_of(
    st.sampled_from(dotted_keys(Config)),
    st.sampled_from(["train", "train.", ".seed", "train..max_steps", "nope.x", "seed.x", "Seed"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz._", min_size=1, max_size=12),
)
VALUES = st.one_of(
    st.sampled_from(
        [
            "",
            "0",
            "-1",
            "1",
            "3",
            "2.5",
            "1e9",
            "nan",
            "inf",
            "true",
            "off",
            "auto",
            "[]",
            "[ecc]",
            "[nope]",
            "{}",
            "{a: 1}",
            "[",
            "{",
            "'",
            "null",
            "~",
            "gloo",
            "nccl",
            "x:y",
            "trainbox.tasks.spirals:model",
            "no.such:thing",
            ":",
            "require",
            "cosine",
            "linear",
            "bf16",
        ]
    ),
    st.text(max_size=8),
)


def settable(value: str) -> bool:
    """Whether a process environment can hold `value` at all (no NUL, encodable)."""
    try:
        return b"\0" not in os.fsencode(value)
    except UnicodeError:
        return False


# What a real process can be started with: the launch variables, minus impossible values.
PROCESS_ENVIRONMENTS = st.one_of(ENVIRONMENTS, near_real_environments()).map(
    lambda env: {k: v for k, v in env.items() if settable(v)}
)
OVERRIDES = st.lists(st.builds(lambda k, v: f"{k}={v}", KEYS, VALUES), max_size=5)


def fake_getaddrinfo(host: str, *args: object, **kwargs: object) -> list[object]:
    del args, kwargs
    if host in RESOLVABLE:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@contextlib.contextmanager
def isolated(env: dict[str, str], run_dir: Path) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """This process with exactly `env` (plus PATH/HOME), fake DNS, and captured output."""
    base = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(
            os.environ, {**base, **env, "TRAINBOX_RUN_DIR_ROOT": str(run_dir)}, clear=True
        ),
        mock.patch("socket.getaddrinfo", fake_getaddrinfo),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        yield out, err


def invoke(argv: list[str], env: dict[str, str], run_dir: Path) -> tuple[int, str]:
    with isolated(env, run_dir) as (_, err):
        try:
            code = cli.main(argv)
        except SystemExit as stop:  # argparse's own usage errors
            code = stop.code if isinstance(stop.code, int) else 2
    return code, err.getvalue()


def assert_clean_outcome(code: int, stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert code in EXIT_CODES, (code, stderr)
    errors = [line for line in stderr.splitlines() if line.startswith("trainbox: error:")]
    if code in (2, 4) and "usage:" not in stderr:
        assert len(errors) == 1, stderr
        assert "HINT:" in errors[0], stderr


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(overrides=OVERRIDES, env=PROCESS_ENVIRONMENTS)
def test_doctor_never_shows_a_traceback(
    overrides: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    code, stderr = invoke(["doctor", "--json", f"run_dir={tmp_path}", *overrides], env, tmp_path)
    assert_clean_outcome(code, stderr)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(overrides=OVERRIDES, env=PROCESS_ENVIRONMENTS)
def test_run_reads_all_its_input_without_a_traceback(
    overrides: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    reached: list[str] = []

    def arrive(where: str, result: object = None) -> mock.Mock:
        return mock.Mock(side_effect=lambda *_, **__: reached.append(where) or result)

    summary = TrainSummary.from_record({"steps": 0}, already_complete=False)
    with (
        mock.patch("trainbox.process.preempt.StopRequests.install", return_value=lambda: None),
        mock.patch("trainbox.process.bootstrap.apply_cpu_plan", arrive("pin")),
        mock.patch("trainbox.process.launching.supervise_workers", arrive("supervise", 0)),
        mock.patch("trainbox.runtime.trainer.train", arrive("train", summary)),
    ):
        code, stderr = invoke(["run", f"run_dir={tmp_path}", *overrides], env, tmp_path)
    assert_clean_outcome(code, stderr)
    # Exit 0 means the input was accepted and training (or node mode's hand-off) was reached.
    if code == 0:
        assert reached[-1] in ("train", "supervise")
