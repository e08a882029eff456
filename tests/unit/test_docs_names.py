"""Every option (`trainbox run --config`) and config key (`train.max_steps=`, `train.amp`) that
README.md, CONTRIBUTING.md and docs/*.md show exists: options per `trainbox <command> --help`
(which outlives any restructuring of the parser), keys per trainbox.config's dataclasses."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.commands import registry
from trainbox.config import Config, leaves

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = tuple(command.name for command in registry.COMMANDS)

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")
# `trainbox <command>` and what follows it up to the end of that shell command or table cell:
# an unescaped |, ;, &&, a # comment, or `--` (after which the words are exec's CMD's).
INVOCATION = re.compile(
    rf"(?<![\w:/-])trainbox\s+({'|'.join(COMMANDS)})\b((?:[^|;&#\\]|\\.)*?)(?=\s--\s|\s--$|[|;&#]|$)"
)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# A dotted key of a config section, e.g. train.amp, data.args.noise.
KEY = re.compile(
    r"(?<![\w./-])(?:model|data|train|optim|dist|preflight|pinning|health)(?:\.[a-z_]+)+"
)
# Mappings whose entries are the factory's own arguments, not config keys.
FREE = ("model.args.", "data.args.", "optim.args.", "optim.schedule_args.")
# File names look like keys: train.py, train.def.
FILES = (".py", ".yaml", ".yml", ".json", ".csv", ".md", ".sh", ".pt", ".png", ".def", ".sif")


def code(text: str) -> list[str]:
    """The code a page shows: every line of its fenced blocks (continuations joined) and every
    inline span outside them."""
    lines = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    return lines + SPAN.findall(FENCE.sub("", text))


def flags_named(snippets: list[str]) -> set[tuple[str, str]]:
    """(command, --option) for every option written after `trainbox <command>`."""
    return {
        (command, flag)
        for snippet in snippets
        for command, rest in INVOCATION.findall(snippet)
        for flag in FLAG.findall(rest)
    }


def keys_named(snippets: list[str]) -> set[str]:
    """Config keys given a value (`key=`) anywhere in code, or making up a whole inline span."""
    named = set()
    for snippet in snippets:
        for match in KEY.finditer(snippet):
            whole = match.start() == 0 and match.end() == len(snippet)
            if snippet[match.end() : match.end() + 1] == "=" or whole:
                named.add(match.group(0))
    return {key for key in named if not key.startswith(FREE) and not key.endswith(FILES)}


@functools.cache
def options(command: str) -> frozenset[str]:
    """The options `trainbox <command> --help` lists."""
    env = {**os.environ, "COLUMNS": "200"}
    helped = subprocess.run(
        [sys.executable, "-m", "trainbox", command, "--help"],
        capture_output=True, text=True, env=env, timeout=120, check=True, cwd=ROOT,
    )  # fmt: skip
    return frozenset(FLAG.findall(helped.stdout))


KNOWN_KEYS = {key for key, *_ in leaves(Config, "")}


@pytest.mark.parametrize(
    ("text", "flags"),
    [
        ("`trainbox run --config my.yaml train.amp=true`", {("run", "--config")}),
        ("torchrun --nproc-per-node 2 -m trainbox run --debug", {("run", "--debug")}),
        ("trainbox exec --config c.yaml -- python x.py --lr 3", {("exec", "--config")}),
        (
            "| `trainbox predict --checkpoint P [--split val\\|train] [--force]` | writes |",
            {("predict", "--checkpoint"), ("predict", "--split"), ("predict", "--force")},
        ),
        ("trainbox run  # then --resume by hand", set()),
        ("docker run trainbox:gpu run --output x", set()),
    ],
)
def test_options_are_read_after_the_command_only(text: str, flags: set[tuple[str, str]]) -> None:
    assert flags_named(code(text) if "`" in text else [text]) == flags


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("`train.amp`", {"train.amp"}),
        ("`train.max_steps=200`", {"train.max_steps"}),
        (
            "```sh\ntrainbox run dist.procs_per_node=4 data.args.noise=0.8\n```",
            {"dist.procs_per_node"},
        ),
        ("`model.parameters()`, `train.run.train()`, `preflight.judge ─►`", set()),
        ("`train.def` and `train.sif`", set()),
        ("`unknown key 'train.max_step' (did you mean 'train.max_steps'?)`", set()),
    ],
)
def test_keys_are_values_given_or_whole_spans(text: str, keys: set[str]) -> None:
    assert keys_named(code(text)) == keys


def test_help_lists_the_options_of_each_command() -> None:
    assert {"--checkpoint", "--output", "--split", "--help"} <= options("predict")
    assert "--checkpoint" not in options("run")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_option_shown_exists(page: Path) -> None:
    named = flags_named(code(page.read_text()))
    assert sorted((c, f) for c, f in named if f not in options(c)) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_key_shown_exists(page: Path) -> None:
    assert sorted(keys_named(code(page.read_text())) - KNOWN_KEYS) == []
