"""Config: defaults < YAML file < dotted overrides, strict types, unknown keys with a suggestion."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

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
        ("seed: !!int x\n", "is not valid YAML at line 1, column 7: !!int 'x' is not a valid int"),
        ("model:\n  args: {x: !!float abc}\n", "!!float 'abc' is not a valid float"),
        ("model:\n  args: {x: !!timestamp no}\n", "!!timestamp 'no' is not a valid timestamp"),
        ("model:\n  args: {x: !!bool maybe}\n", "!!bool 'maybe' is not a valid bool"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, message: str) -> None:
    assert message in "; ".join(problems(write(tmp_path, text)))


def test_missing_file() -> None:
    assert problems("/no/such/config.yaml") == [
        "config file '/no/such/config.yaml' cannot be read (No such file or directory)"
    ]


def hint(path: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        config.load(path, list(overrides))
    return caught.value.hint


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding examples/user_model/config.yaml, as a checkout does."""
    (tmp_path / "examples" / "user_model").mkdir(parents=True)
    (tmp_path / "examples" / "user_model" / "config.yaml").write_text("seed: 1\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "given",
    ["examples/user_model/confg.yaml", "examples/usr_model/config.yaml", "examples/user_model"],
)
def test_a_config_file_that_is_not_there_gets_a_hint_about_the_file(
    project: Path, given: str
) -> None:
    """A typo in the path is named with the file meant, never with override syntax."""
    found = hint(given)
    assert "did you mean --config examples/user_model/config.yaml?" in found
    assert f"relative to the working directory {project}" in found
    assert "override" not in found


def test_a_config_file_with_no_near_name_says_where_it_was_looked_for(project: Path) -> None:
    found = hint("configs/train.yaml")
    assert "did you mean" not in found
    assert f"--config configs/train.yaml is read relative to the working directory {project}" in (
        found
    )


@pytest.mark.usefixtures("project")
def test_a_missing_config_file_beside_a_bad_override_keeps_the_general_hint() -> None:
    assert "override keys as" in hint("nope.yaml", "train.max_step=1")


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


# Issue 19, item 1: a whole mapping given on the command line replaces the mapping; dotted keys
# under `*.args` nest; anything that cannot be applied is an error, never silently dropped.
@pytest.mark.parametrize(
    ("file_args", "overrides", "expected"),
    [
        (None, ["model.args={hidden: 32}"], {"hidden": 32}),
        ("{hidden: 16, layers: 3}", ["model.args={hidden: 32}"], {"hidden": 32}),
        ("{hidden: 16, layers: 3}", ["model.args.hidden=32"], {"hidden": 32, "layers": 3}),
        (None, ["model.args.enc.depth=4"], {"enc": {"depth": 4}}),
        ("{enc: {width: 8}}", ["model.args.enc.depth=4"], {"enc": {"width": 8, "depth": 4}}),
        (None, ["model.args={hidden: 32}", "model.args.layers=1"], {"hidden": 32, "layers": 1}),
        (None, ["model.args.layers=1", "model.args={hidden: 32}"], {"hidden": 32}),
        ("{hidden: 16}", ["model.args={}"], {}),
    ],
)
def test_mapping_overrides_are_applied_in_order(
    tmp_path: Path, file_args: str | None, overrides: list[str], expected: dict[str, object]
) -> None:
    path = write(tmp_path, f"model:\n  args: {file_args}\n") if file_args else None
    assert config.load(path, overrides).model.args == expected


@pytest.mark.parametrize(
    ("file_args", "override", "message"),
    [
        (None, "model.args=5", "model.args=5 must be a mapping of names to values"),
        (None, "model.args=[1, 2]", "model.args=[1, 2] must be a mapping of names to values"),
        (None, "model.args=", "model.args='' must be a mapping of names to values"),
        (None, "model.args={1: 2}", "model.args={1: 2} must be a mapping of names to values"),
        (None, "model.args={hidden: 32", "model.args='{hidden: 32' is not valid YAML"),
        ("{enc: 3}", "model.args.enc.depth=4", "model.args.enc is 3, not a mapping"),
        (None, "model.args.=4", "model.args. names an empty key"),
        (None, "data.args..seed=4", "data.args..seed names an empty key"),
    ],
)
def test_mapping_overrides_that_cannot_be_applied_are_errors(
    tmp_path: Path, file_args: str | None, override: str, message: str
) -> None:
    path = write(tmp_path, f"model:\n  args: {file_args}\n") if file_args else None
    assert message in "; ".join(problems(path, override))


def test_resolved_yaml_shows_a_replaced_mapping() -> None:
    loaded = config.load(None, ["model.args={hidden: 32}", "data.args.split.val=0.1"])
    resolved = yaml.safe_load(config.to_yaml(loaded))
    assert resolved["model"]["args"] == {"hidden": 32}
    assert resolved["data"]["args"] == {"split": {"val": 0.1}}


# Issue 19, item 9: every float key must be finite (torch crashes later on NaN or infinity).
FLOAT_KEYS = [
    key for key, kind, _spec, _default in config.leaves(config.Config, "") if kind is float
]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1.0e+400"])
def test_float_keys_must_be_finite(key: str, value: str) -> None:
    (problem,) = problems(None, f"{key}={value}")
    assert problem.startswith(f"{key}=")
    assert problem.endswith("must be a finite number")


@pytest.mark.parametrize("text", ["optim:\n  lr: .nan\n", "optim:\n  lr: 1e400\n"])
def test_float_keys_in_a_file_must_be_finite(tmp_path: Path, text: str) -> None:
    (problem,) = problems(write(tmp_path, text))
    assert problem.endswith("must be a finite number")


# Issue 19, items 9 and 10: the run name is one folder under runs/, never a path out of it.
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "name='' must not be empty"),
        (".", "name='.' must not be '.' or '..'"),
        ("..", "name='..' must not be '.' or '..'"),
        ("../../x", "name='../../x' must be one folder name, without '/' or '\\'"),
        ("a/b", "name='a/b' must be one folder name, without '/' or '\\'"),
        ("a\\b", "must be one folder name, without '/' or '\\'"),
        ("x" * 300, "(300 bytes) must be at most 128 bytes in UTF-8"),
        ("tab\there", "must not contain control characters"),
        ("é" * 65, "(130 bytes) must be at most 128 bytes in UTF-8"),
    ],
)
def test_run_names_that_are_not_one_folder_are_rejected(name: str, message: str) -> None:
    found = problems(None, f"name={name}")
    assert message in "; ".join(found)


@pytest.mark.parametrize("name", ["example", "007", "lr-0.1_bs=64", "ünïcode", "x" * 128])
def test_ordinary_run_names_are_accepted(name: str) -> None:
    assert config.load(None, [f"name={name}"]).output_dir == Path("runs") / name


# Issue 19, item 11: a YAML error says the parser's reason, on one line.
def test_yaml_errors_give_the_parsers_reason(tmp_path: Path) -> None:
    (problem,) = problems(write(tmp_path, "train:\n\tmax_steps: 1\n"))
    assert "is not valid YAML at line 2, column 1" in problem
    assert "found character '\\t' that cannot start any token" in problem
    assert "\n" not in problem


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"seed: \xff\n")
    (problem,) = problems(str(path))
    assert problem == f"config file {str(path)!r} is not UTF-8 text (byte 0xff at offset 6)"


@pytest.mark.parametrize("written", ["5e-3", "5E-3", "-1e+2", "1e3", ".5e-1", "5.0e-3"])
def test_exponent_numbers_in_args_reach_user_code_as_floats(tmp_path: Path, written: str) -> None:
    # YAML 1.1 (PyYAML) reads `5e-3` as a string: a user's scheduler then got '5e-3' and crashed.
    expected = float(written)
    from_override = config.load(None, [f"optim.schedule_args.peak={written}"])
    assert from_override.optim.schedule_args == {"peak": expected}
    file = tmp_path / "c.yaml"
    file.write_text(f"model:\n  args:\n    lr: {written}\n    nested: {{decay: {written}}}\n")
    from_file = config.load(str(file), [])
    assert from_file.model.args == {"lr": expected, "nested": {"decay": expected}}


def test_text_that_only_looks_like_an_exponent_stays_text() -> None:
    loaded = config.load(None, ["model.args.tag=e5", "model.args.id=1e", "model.args.v=1.2.3"])
    assert loaded.model.args == {"tag": "e5", "id": "1e", "v": "1.2.3"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "\\ud800"\n', "name holds a lone surrogate '\\ud800', which is not text"),
        ('model:\n  args: {x: [ok, "a\\udc00"]}\n', "model.args.x[1] holds a lone surrogate"),
    ],
)
def test_yaml_escapes_that_are_not_text_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    # Such a string could be neither printed nor written to config.yaml as UTF-8.
    (problem,) = problems(write(tmp_path, text))
    assert message in problem


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("name=run\udcff", "name='run\\udcff' must be UTF-8 text"),
        ("model.args.x=run\udcff", "model.args.x='run\\udcff' must be UTF-8 text"),
        ("model.args.\udcff=1", "model.args has a key '\\udcff' that is not UTF-8 text"),
    ],
)
def test_an_override_that_is_not_utf8_is_refused(override: str, message: str) -> None:
    # A byte that is not UTF-8 in argv arrives as a lone surrogate (surrogateescape).
    assert problems(None, override) == [message]
