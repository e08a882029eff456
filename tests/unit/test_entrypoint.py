"""The image's POSIX sh entrypoint: options and overrides go to `run`, subcommands to trainbox,
anything else runs as is. Run under dash, Debian's /bin/sh, with a stand-in `trainbox` on PATH."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trainbox.commands.registry import COMMANDS

ENTRYPOINT = Path(__file__).parents[2] / "entrypoint" / "trainbox-entrypoint.sh"


@pytest.fixture
def path_with_fake_trainbox(tmp_path: Path) -> str:
    fake = tmp_path / "trainbox"
    fake.write_text('#!/bin/sh\necho "trainbox $*"\n')
    fake.chmod(0o755)
    return f"{tmp_path}:{os.environ['PATH']}"


@pytest.mark.parametrize(
    ("args", "env", "output"),
    [
        ([], {}, "trainbox run"),
        (["--config", "c.yaml"], {}, "trainbox run --config c.yaml"),
        (["train.max_steps=10", "seed=3"], {}, "trainbox run train.max_steps=10 seed=3"),
        (["--json"], {"TRAINBOX_DEFAULT_COMMAND": "doctor"}, "trainbox doctor --json"),
        (["report", "runs/x"], {}, "trainbox report runs/x"),
        (["hang", "runs/x"], {}, "trainbox hang runs/x"),
        (["doctor", "--json"], {}, "trainbox doctor --json"),
        (["exec", "--", "python", "x.py"], {}, "trainbox exec -- python x.py"),
        (["eval", "--checkpoint", "runs/x"], {}, "trainbox eval --checkpoint runs/x"),
        (
            ["predict", "--checkpoint", "runs/x", "--output", "p.csv"],
            {},
            "trainbox predict --checkpoint runs/x --output p.csv",
        ),
        (["echo", "hello", "world"], {}, "hello world"),
    ],
)
def test_dispatch(
    path_with_fake_trainbox: str, args: list[str], env: dict[str, str], output: str
) -> None:
    shell = shutil.which("dash") or "sh"
    proc = subprocess.run(
        [shell, str(ENTRYPOINT), *args],
        env={"PATH": path_with_fake_trainbox, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == output


def test_entrypoint_is_executable() -> None:
    assert os.access(ENTRYPOINT, os.X_OK)


def test_every_cli_subcommand_reaches_trainbox(path_with_fake_trainbox: str) -> None:
    # A subcommand added to the CLI but not to the entrypoint would be exec'd as a program.
    from trainbox import cli

    parser = cli._parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    shell = shutil.which("dash") or "sh"
    for name in commands.choices:
        proc = subprocess.run(
            [shell, str(ENTRYPOINT), name],
            env={"PATH": path_with_fake_trainbox},
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.stdout.strip() == f"trainbox {name}", f"{name}: {proc.stderr.strip()}"


def test_the_case_list_names_exactly_the_registered_commands() -> None:
    # A command removed from trainbox but left in the list would reach trainbox as an error.
    text = ENTRYPOINT.read_text()
    routed = re.search(r'^\s*([\w |]+)\) exec trainbox "\$@" ;;$', text, re.M)
    described = re.search(r"a trainbox subcommand \(([\w ]+)\)", text)
    assert routed is not None
    assert described is not None
    registered = sorted(command.name for command in COMMANDS)
    assert sorted(name.strip() for name in routed.group(1).split("|")) == registered
    assert sorted(described.group(1).split()) == registered
