"""Config: defaults < YAML file < dotted overrides, strict types, unknown keys with a suggestion."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainbox import config
from trainbox.config import ConfigError

CONFIG_DOCS = Path(__file__).parents[2] / "docs" / "configuration.md"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def problems(path: str | None, *overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config.load(path, list(overrides))
    return caught.value.problems


def test_defaults() -> None:
    loaded = config.load(None, [])
    assert loaded == config.Config()
    assert loaded.output_dir == Path("runs/example")


def test_file_then_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "seed: 3\ntrain:\n  max_steps: 10\n  batch_size: 8\nmodel:\n  args: {hidden: 16}\n",
    )
    loaded = config.load(path, ["train.max_steps=20", "model.args.layers=1", "optim.lr=1e-2"])
    assert (loaded.seed, loaded.train.max_steps, loaded.train.batch_size) == (3, 20, 8)
    assert loaded.model.args == {"hidden": 16, "layers": 1}
    assert loaded.optim.lr == 0.01


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.deterministic=true", ("train", "deterministic", True)),
        ("optim.lr=1", ("optim", "lr", 1.0)),
        ("name=007", ("name", None, "007")),
        ("train.resume=/ckpt/step-00000007.pt", ("train", "resume", "/ckpt/step-00000007.pt")),
        ("train.amp=bf16", ("train", "amp", "bf16")),
        ("data.args.features=[x1, x2]", ("data", "args", {"features": ["x1", "x2"]})),
    ],
)
def test_override_values_are_typed_by_their_field(
    override: str, expected: tuple[str, str | None, object]
) -> None:
    loaded = config.load(None, [override])
    section, name, value = expected
    got = getattr(loaded, section) if name is None else getattr(getattr(loaded, section), name)
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.max_step=5"], "unknown key 'train.max_step' (did you mean 'train.max_steps'?)"),
        (["trian.max_steps=5"], "unknown key 'trian' (did you mean 'train'?)"),
        (["bogus=1"], "unknown key 'bogus'"),
        (["train.batch_size=big"], "train.batch_size='big' must be an integer"),
        (["train.batch_size=0"], "train.batch_size=0 must be at least 1"),
        (["train.batch_size=2.5"], "train.batch_size=2.5 must be an integer"),
        (["train.compile=maybe"], "train.compile='maybe' must be true or false"),
        (["train.amp=fp8"], "train.amp='fp8' must be one of auto, off, bf16, fp16"),
        (["optim.lr=fast"], "optim.lr='fast' must be a number"),
        (["optim.min_lr_ratio=2"], "optim.min_lr_ratio=2 must be at most 1"),
        (
            ["model.factory=nocolon"],
            "model.factory='nocolon' must look like package.module:function",
        ),
        (["train=5"], "train is a section; set its keys instead"),
        (["seed.value=5"], "seed is a single value, not a section with keys"),
        (["max_steps"], "override 'max_steps' is not key=value"),
    ],
)
def test_bad_overrides(overrides: list[str], message: str) -> None:
    assert message in "; ".join(problems(None, *overrides))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train: [1, 2]\n", "train must be a mapping"),
        ("train:\n  max_steps: ten\n", "train.max_steps='ten' must be an integer"),
        ("trainer:\n  max_steps: 1\n", "unknown key 'trainer' (did you mean 'train'?)"),
        ("- a\n- b\n", "must hold a mapping of keys, not list"),
        ("train:\n  max_steps: 1\n bad indent: [\n", "is not valid YAML at line"),
        ("model:\n  args: [1]\n", "model.args must be a mapping"),
        ("name: 7\n", "name=7 must be a string"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, message: str) -> None:
    assert message in "; ".join(problems(write(tmp_path, text)))


def test_missing_file() -> None:
    assert problems("/no/such/config.yaml") == [
        "config file '/no/such/config.yaml' cannot be read (No such file or directory)"
    ]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  max_steps: ten\n  batch: 3\n")
    found = problems(path, "optim.lr=x", "dist.backend=mpi")
    assert len(found) == 4


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert config.load(write(tmp_path, ""), []) == config.Config()


def test_resolved_yaml_loads_back_to_the_same_config(tmp_path: Path) -> None:
    original = config.load(None, ["seed=5", "model.args.hidden=32", "train.amp=off"])
    assert config.load(write(tmp_path, config.to_yaml(original)), []) == original


def test_fingerprint_ignores_key_order() -> None:
    assert config.fingerprint({"a": 1, "b": {"c": 2}}) == config.fingerprint(
        {"b": {"c": 2}, "a": 1}
    )
    assert config.fingerprint(config.Config()) != config.fingerprint(config.load(None, ["seed=1"]))


def test_docs_config_reference_is_generated_from_the_dataclasses() -> None:
    text = CONFIG_DOCS.read_text()
    block = re.search(
        r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", text, re.S
    )
    assert block is not None, "docs/configuration.md lacks the config-reference markers"
    assert block.group(1) == config.reference_markdown(), "run: python scripts/config_reference.py"


def test_yaml_1_1_surprises_are_read_as_meant(tmp_path: Path) -> None:
    # PyYAML reads `1e-3` as a string and `off` as false; both fields say what was meant.
    loaded = config.load(write(tmp_path, "optim:\n  lr: 1e-3\ntrain:\n  amp: off\n"), [])
    assert (loaded.optim.lr, loaded.train.amp) == (0.001, "off")
