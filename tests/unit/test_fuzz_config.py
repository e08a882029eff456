"""Fuzzed config files: anchors, aliases, deep nesting and odd YAML types, wherever keys go.

`trainbox config --config FILE` either accepts the file (exit 0) or refuses it with exit 2 and
one line with a HINT, without a traceback, within 5 s (a hundred times the usual cost: the
bound catches a hang, not a slow machine). What it accepts, every rank can hash, write
back as config.yaml and keep in a checkpoint that loads with `weights_only`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch
from hypothesis import event, example, given
from hypothesis import strategies as st

from trainbox import config

from fuzzing import assert_refused, files_under, fuzz, invoke, scratch

# Scalars as a careless or hostile user writes them: YAML 1.1 surprises, tags safe_load
# refuses, tags it accepts (dates, binary), non-finite and huge numbers, broken syntax.
ODD_SCALARS = [
    "1",
    "-0",
    "0x1F",
    "0o17",
    "1_000",
    "1e309",
    "-.inf",
    ".nan",
    "~",
    "null",
    "yes",
    "off",
    "2020-01-01",
    "2020-01-01T10:00:00Z",
    "!!binary aGVsbG8=",
    "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system",
    "!!str 1",
    "!!int x",
    "!!float abc",
    "!!timestamp nope",
    "!custom 1",
    '"\\0"',
    "'it''s'",
    "<<",
    "=",
    "*undefined",
    "&",
    "[",
    "{",
    "'",
    "x" * 5000,
    "trainbox.tasks.spirals:model",
]


def flow(depth: int, opener: str, closer: str, inner: str = "") -> str:
    return opener * depth + inner + closer * depth


SCALARS = st.one_of(
    st.sampled_from(ODD_SCALARS),
    st.text(max_size=12).map(json.dumps),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def values(leaf: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """YAML flow values made of `leaf` texts: lists, mappings, sets, omaps, deep nests."""
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map(lambda items: f"[{', '.join(items)}]"),
            st.lists(st.tuples(SCALARS, inner), max_size=4).map(
                lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
            ),
            st.lists(st.sampled_from("abc"), max_size=3).map(
                lambda items: f"!!set {{{', '.join(items)}}}"
            ),
            st.lists(inner, max_size=3).map(
                lambda items: f"!!omap [{', '.join(f'k{i}: {v}' for i, v in enumerate(items))}]"
            ),
            st.integers(min_value=1, max_value=3000).map(lambda n: flow(n, "[", "]")),
            st.integers(min_value=1, max_value=3000).map(lambda n: flow(n, "{a: ", "}", "1")),
        ),
        max_leaves=12,
    )


@st.composite
def aliased(draw: st.DrawFn) -> list[str]:
    """`name: value` lines that define anchors and use them, up to a bomb or a self-reference."""
    lines = [f"a0: &a0 {draw(values(SCALARS))}"]
    for level in range(1, draw(st.integers(min_value=0, max_value=9))):
        uses = draw(st.integers(min_value=1, max_value=12))
        shape = draw(st.sampled_from(["list", "map", "self", "merge"]))
        before = f"*a{draw(st.integers(min_value=0, max_value=level - 1))}"
        if shape == "list":
            value = f"[{', '.join([before] * uses)}]"
        elif shape == "map":
            value = "{" + ", ".join(f"k{i}: {before}" for i in range(uses)) + "}"
        elif shape == "self":
            value = f"[{before}, *a{level}]"
        else:
            value = f"{{<<: {before}, extra: 1}}"
        lines.append(f"a{level}: &a{level} {value}")
    return lines


# Where a value lands: the free-form mappings handed to user code, a typed key, a section, an
# unknown key.
PLACES = [
    "model.args",
    "data.args",
    "optim.schedule_args",
    "train.max_steps",
    "preflight.fatal",
    "name",
    "train",
    "nope",
]


def placed(place: str, lines: list[str]) -> str:
    """`lines` (`key: value`) as the mapping at dotted `place`, or its value when it is a leaf."""
    section, _, leaf = place.partition(".")
    if place in ("model.args", "data.args", "optim.schedule_args"):
        body = "".join(f"    {line}\n" for line in lines)
        return f"{section}:\n  {leaf}:\n{body}"
    value = lines[-1].partition(": ")[2]
    if leaf:
        return f"{section}:\n  {leaf}: {value}\n"
    return f"{section}: {value}\n"


# Values as most files hold them, so that many documents are accepted and checked downstream.
PLAIN = st.one_of(
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["abc", "true", "null", "'007'", "x y", "5e-3"]),
)
DOCUMENTS = st.one_of(
    st.builds(
        placed,
        st.sampled_from(PLACES[:3]),
        st.lists(st.tuples(st.sampled_from("abcde"), values(PLAIN)).map(": ".join), min_size=1),
    ),
    st.builds(
        placed,
        st.sampled_from(PLACES),
        st.one_of(aliased(), st.lists(values(SCALARS).map(lambda v: f"x: {v}"), min_size=1)),
    ),
    values(SCALARS),
    st.text(max_size=200),
)


def assert_usable_everywhere(loaded: config.Config, tmp_path: Path) -> None:
    """What ranks do with an accepted config: hash it, write it back, keep it in a checkpoint."""
    written = tmp_path / "written" / "config.yaml"
    written.parent.mkdir()
    written.write_text(config.to_yaml(loaded))
    assert config.fingerprint(config.load(str(written), [])) == config.fingerprint(loaded)
    buffer = io.BytesIO()
    torch.save({"config": config.as_dict(loaded)}, buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=True)


@fuzz(300)
@given(document=DOCUMENTS)
# What fuzzing found: a tag's value that is not of its type, and an escape that is not text.
@example(document="seed: !!int x\n")
@example(document='name: &a0 "\\ud800\\udc00"\n')
def test_a_config_file_is_accepted_whole_or_refused_in_one_line(document: str) -> None:
    with scratch() as folder:
        path = folder / "c.yaml"
        path.write_text(document, encoding="utf-8")
        before = files_under(folder)
        outcome = invoke(["config", "--config", str(path)])
        assert files_under(folder) == before
        event(f"exit {outcome.code}")
        if outcome.code == 0:
            assert outcome.stderr == ""
            assert outcome.seconds < 5
            assert_usable_everywhere(config.load(str(path), []), folder)
        else:
            assert_refused(outcome, within_s=5)


@fuzz(100)
@given(document=values(SCALARS), key=st.sampled_from(["model.args", "data.args.x", "seed"]))
def test_an_override_value_is_accepted_or_refused_in_one_line(document: str, key: str) -> None:
    outcome = invoke(["config", f"{key}={document}"])
    if outcome.code == 0:
        assert outcome.seconds < 5
    else:
        assert_refused(outcome, within_s=5)


@fuzz(50)
@given(raw=st.binary(max_size=200))
def test_a_config_file_of_any_bytes_is_accepted_or_refused_in_one_line(raw: bytes) -> None:
    with scratch() as folder:
        path = folder / "c.yaml"
        path.write_bytes(raw)
        outcome = invoke(["config", "--config", str(path)])
    if outcome.code != 0:
        assert_refused(outcome, within_s=5)
