"""The CSV data factory: tensors and class mapping, one-line errors naming file, line and column."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainbox import config
from trainbox.config import factories
from trainbox.errors import UsageError
from trainbox.tasks import tabular
from trainbox.train.data import contract

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tabular"

TRAIN = "x1,x2,label\n0.5,1,cat\n1.5,-2,dog\n2.5,3e2,cat\n"


def write(tmp_path: Path, name: str, text: str) -> str:
    """The path of a new file `name` in tmp_path holding `text`."""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def problems(tmp_path: Path, train: str, val: str | None = None, **kwargs: object) -> str:
    """The one-line error that loading these files gives."""
    val_csv = write(tmp_path, "val.csv", val) if val is not None else None
    with pytest.raises(UsageError) as caught:
        tabular.data(train_csv=write(tmp_path, "train.csv", train), val_csv=val_csv, **kwargs)
    return caught.value.line()


def test_classification_tensors_and_class_mapping(tmp_path: Path) -> None:
    val = "x1,x2,label\n9,9,dog\n"
    got = tabular.data(train_csv=write(tmp_path, "t.csv", TRAIN), val_csv=write(tmp_path, "v", val))
    train, val_set = got.train, got.val
    assert isinstance(got, contract.Datasets)
    assert train.inputs.dtype == torch.float32
    assert train.inputs.shape == (3, 2)
    assert train.targets.dtype == torch.int64
    assert train.targets.tolist() == [0, 1, 0]
    assert train.classes == val_set.classes == ("cat", "dog")
    assert train.features == ("x1", "x2")
    assert train.num_features == 2
    assert len(train) == 3
    inputs, target = train[2]
    assert inputs.tolist() == [2.5, 300.0]
    assert target.item() == 0
    assert val_set.targets.tolist() == [1]


def test_numeric_labels_sort_by_value(tmp_path: Path) -> None:
    text = "x,label\n1,10\n2,2\n3,1.5\n4,b\n5,a\n6,-1\n"
    train = tabular.data(train_csv=write(tmp_path, "t.csv", text)).train
    assert train.classes == ("-1", "1.5", "2", "10", "a", "b")
    assert train.targets.tolist() == [3, 2, 1, 5, 4, 0]


def test_regression_targets_are_float_vectors(tmp_path: Path) -> None:
    text = "a,b,y\n1,2,0.5\n3,4,-1e3\n"
    got = tabular.data(train_csv=write(tmp_path, "t.csv", text), target="y", task="regression")
    assert got.val is None
    assert got.train.targets.dtype == torch.float32
    assert got.train.targets.tolist() == [0.5, -1000.0]
    assert got.train.inputs.shape == (2, 2)
    assert got.train.classes == ()


def test_features_default_to_all_but_target_and_can_be_chosen(tmp_path: Path) -> None:
    text = "x1,label,x2,x3\n1,a,2,3\n4,b,5,6\n"
    path = write(tmp_path, "t.csv", text)
    assert tabular.data(train_csv=path).train.features == ("x1", "x2", "x3")
    chosen = tabular.data(train_csv=path, features=["x3", "x1"]).train
    assert chosen.features == ("x3", "x1")
    assert chosen.inputs.tolist() == [[3.0, 1.0], [6.0, 4.0]]


def test_val_uses_the_train_columns_in_train_order(tmp_path: Path) -> None:
    train = write(tmp_path, "t.csv", "x1,x2,label\n1,2,a\n3,4,b\n")
    val = write(tmp_path, "v.csv", "label,x2,x1,extra\nb,20,10,zzz\n")
    got = tabular.data(train_csv=train, val_csv=val)
    assert got.val.inputs.tolist() == [[10.0, 20.0]]
    assert got.val.targets.tolist() == [1]


def test_blank_lines_and_a_byte_order_mark_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfx1,label\r\n1,a\r\n\r\n2,b\r\n,\r\n")
    train = tabular.data(train_csv=str(path)).train
    assert train.features == ("x1",)
    assert len(train) == 2


ERRORS = [
    pytest.param("", {}, "train.csv has no rows (it is empty)", id="empty"),
    pytest.param("x1,label\n", {}, "train.csv has no rows after its header", id="header-only"),
    pytest.param(
        TRAIN, {"target": "lable"}, "has no column 'lable' (did you mean 'label'?)", id="target"
    ),
    pytest.param(TRAIN, {"target": "price"}, "has no column 'price'; it has x1", id="no-match"),
    pytest.param(
        TRAIN,
        {"features": ["x1", "X2"]},
        "train.csv has no column 'X2' (did you mean 'x2'?); it has x1, x2, label",
        id="feature",
    ),
    pytest.param(
        "x1,x2,label\n1,2,a\n2,3,b\n3,4,c\n4,5,d\n5,6,e\n6,7,f\n7,abc,g\n",
        {},
        "train.csv line 8, column 'x2': 'abc' is not a number",
        id="not-a-number",
    ),
    pytest.param(
        "x1,label\n1,a\nnan,b\n", {}, "line 3, column 'x1': 'nan' is not a finite", id="nan"
    ),
    pytest.param(
        "x1,x2,label\n1,2,a\n1,b\n", {}, "train.csv line 3: 2 values, the header has 3", id="ragged"
    ),
    pytest.param(
        "x1,label\n1,a\n2,\n", {}, "line 3, column 'label': the label is empty", id="empty-label"
    ),
    pytest.param(
        "x,y\n1,2\n2,big\n",
        {"target": "y", "task": "regression"},
        "line 3, column 'y': 'big' is not a number",
        id="regression-target",
    ),
    pytest.param(
        TRAIN, {"task": "clasification"}, "data.args.task='clasification' must be one of", id="task"
    ),
    pytest.param(
        TRAIN, {"features": "x1"}, "data.args.features='x1' must be a list", id="features-type"
    ),
    pytest.param(
        TRAIN, {"features": ["label"]}, "features lists the target column 'label'", id="target-in"
    ),
    pytest.param("label\na\nb\n", {}, "has no feature columns besides", id="no-features"),
    pytest.param("x,x,label\n1,2,a\n", {}, "repeats a column name", id="duplicate-column"),
    pytest.param("x,label,\n1,a,\n", {}, "header has no name for column 3", id="unnamed-column"),
    pytest.param("x,label\n1,a\n2,a\n", {}, "has only one class ('a')", id="one-class"),
]


@pytest.mark.parametrize(("train", "kwargs", "expected"), ERRORS)
def test_problems_name_file_line_and_column(
    tmp_path: Path, train: str, kwargs: dict[str, object], expected: str
) -> None:
    line = problems(tmp_path, train, **kwargs)
    assert expected in line
    assert "HINT:" in line


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"nope\.csv does not exist"):
        tabular.data(train_csv=str(tmp_path / "nope.csv"))
    with pytest.raises(UsageError, match=r"cannot be read \(Is a directory\)"):
        tabular.data(train_csv=str(tmp_path))
    with pytest.raises(UsageError, match=r"missing\.csv does not exist"):
        tabular.data(
            train_csv=write(tmp_path, "t.csv", TRAIN), val_csv=str(tmp_path / "missing.csv")
        )


def test_val_label_unseen_in_train_is_reported_once_per_label(tmp_path: Path) -> None:
    val = "x1,x2,label\n1,2,cat\n1,2,bird\n1,2,bird\n1,2,bird\n"
    line = problems(tmp_path, TRAIN, val)
    assert line.count("bird") == 1
    assert (
        "val.csv line 3, column 'label': label 'bird' is not one of the train file's classes "
        "(cat, dog) (and 2 more rows)"
    ) in line


def test_all_problems_of_a_file_at_once_capped_at_ten(tmp_path: Path) -> None:
    rows = "".join(f"{i},x{i},a\n" for i in range(25))
    line = problems(tmp_path, "x1,x2,label\n" + rows)
    assert line.count("is not a number") == 10
    assert "and 15 more" in line


def test_val_problems_name_the_val_file(tmp_path: Path) -> None:
    line = problems(tmp_path, TRAIN, "x1,x2,label\n1,oops,cat\n1,2\n")
    assert "val.csv line 2, column 'x2': 'oops' is not a number" in line
    assert "val.csv line 3: 2 values, the header has 3" in line


def test_make_csv_writes_loadable_files_of_the_stated_sizes(tmp_path: Path) -> None:
    for out in (tmp_path / "a", tmp_path / "b"):
        subprocess.run(
            [sys.executable, str(EXAMPLE / "make_csv.py"), str(out)],
            check=True,
            capture_output=True,
            timeout=60,
        )
    first, second = (tmp_path / run / "train.csv" for run in ("a", "b"))
    assert first.read_bytes() == second.read_bytes()  # seeded, so the same every time
    settings = config.load(
        str(EXAMPLE / "config.yaml"),
        [f"data.args.train_csv={tmp_path}/a/train.csv", f"data.args.val_csv={tmp_path}/a/val.csv"],
    )
    got = contract.build_data(settings.data.factory, settings.data.args)
    assert (len(got.train), len(got.val)) == (3000, 1000)
    assert got.train.classes == ("alpha", "beta", "gamma")
    assert got.train.num_features == settings.model.args["in_features"] == 6
    model = factories.build_model(settings.model.factory, settings.model.args)
    logits = model(got.train.inputs[:8])
    assert logits.shape == (8, len(got.train.classes))
    assert torch.nn.functional.cross_entropy(logits, got.train.targets[:8]).isfinite()


def test_example_config_loads() -> None:
    settings = config.load(str(EXAMPLE / "config.yaml"), [])
    assert settings.data.factory == "trainbox.tasks.tabular:data"
    assert settings.model.factory == "trainbox.tasks.mlp:mlp"
    assert settings.train.loss == "cross_entropy"


def test_numeric_column_names_from_yaml_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "1,2,3\n1,2,a\n3,4,b\n")
    settings = config.load(
        str(EXAMPLE / "config.yaml"),
        [
            f"data.args.train_csv={path}",
            "data.args.val_csv=",
            "data.args.target=3",
            "data.args.features=[2]",
        ],
    )
    assert settings.data.args["target"] == 3  # YAML made it an int
    got = contract.build_data(settings.data.factory, settings.data.args)
    assert got.val is None
    assert got.train.features == ("2",)
    assert got.train.inputs.tolist() == [[2.0], [4.0]]
