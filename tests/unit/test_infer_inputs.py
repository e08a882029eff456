"""eval/predict input checks: checkpoint and config lookup, output paths, problems, kill points."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox import config
from trainbox.distributed import consensus
from trainbox.distributed.consensus import Problem
from trainbox.errors import UsageError
from trainbox.infer import locate
from trainbox.infer.model import config_problem
from trainbox.testing import predict_faults
from trainbox.testing.predict_faults import KillPoint


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-00000007.pt").write_bytes(b"")
    (run / "checkpoints" / "latest").symlink_to("step-00000007.pt")
    (run / "config.yaml").write_text("seed: 7\nmodel:\n  args: {hidden: 16}\n")
    return run


@pytest.mark.parametrize(("given", "found"), [("run", "run/checkpoints/latest"), ("run/checkpoints", "run/checkpoints/latest"),
                                             ("run/checkpoints/step-00000007.pt", "run/checkpoints/step-00000007.pt"),
                                             ("missing.pt", "missing.pt")])  # fmt: skip
def test_checkpoint_path_takes_a_file_or_a_run(tmp_path: Path, given: str, found: str) -> None:
    _run(tmp_path)
    assert locate.checkpoint_path(str(tmp_path / given)) == tmp_path / found


def test_a_checkpoint_inside_its_run_uses_the_runs_config(tmp_path: Path) -> None:
    run = _run(tmp_path)
    settings, source = locate.settings(run / "checkpoints" / "latest", None, ["train.batch_size=5"])
    assert (source, settings.seed, settings.model.args, settings.train.batch_size) == (
        str(run / "config.yaml"),
        7,
        {"hidden": 16},
        5,
    )
    # eval and predict never write run_dir: its checks must not stop them.
    assert not {"run_dir", "disk_space"} & set(settings.preflight.fatal)


def test_a_given_config_wins_and_a_lone_checkpoint_gets_the_defaults(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (tmp_path / "other.yaml").write_text("seed: 3\n")
    assert (
        locate.settings(run / "checkpoints" / "latest", str(tmp_path / "other.yaml"), [])[0].seed
        == 3
    )
    (tmp_path / "lone.pt").write_bytes(b"")
    assert locate.settings(tmp_path / "lone.pt", None, [])[1] is None


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("p.csv", "csv"),
        ("p.jsonl", "jsonl"),
        ("P.CSV", "csv"),
        ("p.txt", None),
        ("p", None),
        ("p.csv.gz", None),
    ],
)
def test_the_extension_picks_the_format(name: str, fmt: str | None) -> None:
    assert locate.output_format(Path(name)) == fmt
    assert (locate.format_problem(Path(name)) is None) == (fmt is not None)


def test_an_existing_output_needs_force(tmp_path: Path) -> None:
    (tmp_path / "p.csv").write_text("old")
    (found,) = locate.destination_problems(tmp_path / "p.csv", force=False)
    assert "already exists" in found.text
    assert "--force" in found.hint
    assert locate.destination_problems(tmp_path / "p.csv", force=True) == []
    assert locate.destination_problems(tmp_path / "new" / "dir" / "p.csv", force=False) == []
    assert "is a directory" in locate.destination_problems(tmp_path, force=True)[0].text


def test_problems_from_every_rank_become_one_error() -> None:
    error = consensus.combined(
        [Problem(text="a", hint="x"), Problem(text="b", hint="y"), Problem(text="a", hint="x")]
    )
    assert isinstance(error, UsageError)
    assert error.line() == "a; b. HINT: x; y"
    assert consensus.combined([]) is None


@pytest.mark.parametrize(
    ("value", "point"),
    [("", KillPoint()), ("parts=3", KillPoint(parts=3)), ("merge", KillPoint(merge=True))],
)
def test_kill_points(value: str, point: KillPoint) -> None:
    assert predict_faults.parse({predict_faults.VARIABLE: value}) == point
    assert predict_faults.parse({}) == KillPoint()


@pytest.mark.parametrize("value", ["parts=0", "parts=x", "parts", "later"])
def test_a_malformed_kill_point_is_a_usage_error(value: str) -> None:
    with pytest.raises(UsageError, match=predict_faults.VARIABLE):
        predict_faults.parse({predict_faults.VARIABLE: value})


def test_a_checkpoint_of_another_model_is_named() -> None:
    settings = config.load(None, ["model.args.hidden=64"])
    ours = config.as_dict(settings)["model"]
    assert config_problem(Path("c.pt"), ours, settings) is None
    assert config_problem(Path("c.pt"), None, settings) is None  # older checkpoints record none
    found = config_problem(Path("c.pt"), {**ours, "args": {}}, settings)
    assert found is not None
    assert "'c.pt' was made with model config" in found.text
