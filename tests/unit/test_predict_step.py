"""`train.predict_step`: what a user's step may return, its one-line errors, and its rows' bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from trainbox.errors import UsageError
from trainbox.infer import columns, rows
from trainbox.infer.columns import Column
from trainbox.train.steps.functions import Step

NAME = "my_pkg.predict:boxes"


def step_returning(value: Any) -> Step:
    return Step(fn=lambda _model, _batch: value, name=NAME)


def table_of(value: Any, count: int = 2) -> columns.Table:
    step = step_returning(value)
    return columns.table(step, step.fn(None, None), count=count)


def test_tensors_and_lists_become_plain_values_per_sample() -> None:
    found = table_of(
        {
            "box": torch.tensor([[0.5, 1.0], [2.0, 3.25]], dtype=torch.bfloat16),
            "label": torch.tensor([3, 4]),
            "keep": torch.tensor([True, False]),
            "name": ["cat", "dog, big"],
            "grid": torch.zeros(2, 2, 2),
        }
    )
    assert found == {
        "box": [[0.5, 1.0], [2.0, 3.25]],
        "label": [[3], [4]],
        "keep": [[True], [False]],
        "name": [["cat"], ["dog, big"]],
        "grid": [[0.0] * 4, [0.0] * 4],
    }
    assert columns.schema(found) == (
        Column(name="box", width=2),
        Column(name="label", width=1),
        Column(name="keep", width=1),
        Column(name="name", width=1),
        Column(name="grid", width=4),
    )


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        (torch.zeros(2), "returned a tensor of shape (2,) and dtype torch.float32, not a dict"),
        ({}, "returned dict {}, not a dict of columns"),
        ({"box": torch.zeros(1, 4)}, "column 'box' is a tensor of shape (1, 4)"),
        ({"box": torch.tensor(1.0)}, "column 'box' is a tensor of shape ()"),
        ({"box": torch.zeros(2, 0)}, "column 'box' is a tensor of shape (2, 0)"),
        ({"name": ["cat"]}, "column 'name' is a list of 1, not 2 values"),
        ({"name": [["cat"], ["dog"]]}, "column 'name' holds a list of 1"),
        ({"name": ["cat", "two\nlines"]}, "a string with a line break"),
        ({"index": [1, 2]}, "column name 'index'"),
        ({"box": 7}, "column 'box' is int 7, not a tensor or list"),
    ],
)
def test_bad_returns_name_the_function_and_the_column(returned: Any, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        table_of(returned)
    line = caught.value.line()
    assert line.startswith(f"train.predict_step {NAME} returned ")
    assert said in line
    assert "HINT:" in line


def test_a_batch_must_have_the_first_samples_columns_and_widths() -> None:
    first = columns.schema(table_of({"box": torch.zeros(1, 2), "id": [1]}, count=1))
    step = step_returning(None)
    columns.check_schema(step, table_of({"box": torch.ones(2, 2), "id": [1, 2]}), first)
    with pytest.raises(UsageError, match="column 'box' with 3 values per sample, 2 for the first"):
        columns.check_schema(step, table_of({"box": torch.ones(2, 3), "id": [1, 2]}), first)
    with pytest.raises(UsageError, match=r"columns \['id', 'box'\] for one batch"):
        columns.check_schema(step, table_of({"id": [1, 2], "box": torch.ones(2, 2)}), first)


TABLE = {"box": [[0.1234567, 2.0], [float("nan"), -1e-9]], "id": [[7], [8]], "name": [["a,b"], ['say "hi"']], "keep": [[True], [False]]}  # fmt: skip


def test_csv_rows_of_a_user_step() -> None:
    widths = {column.name: column.width for column in columns.schema(TABLE)}
    assert rows.step_header("csv", widths) == b"index,box_0,box_1,id,name,keep\n"
    assert rows.render_table("csv", indices=[10, 11], table=TABLE) == (
        b'10,0.123457,2,7,"a,b",true\n11,nan,-1e-09,8,"say ""hi""",false\n'
    )


def test_jsonl_rows_of_a_user_step() -> None:
    assert rows.step_header("jsonl", {"box": 2}) == b""
    text = rows.render_table("jsonl", indices=[10, 11], table=TABLE).decode()
    assert text.splitlines()[0] == '{"index":10,"box":[0.123457,2],"id":7,"name":"a,b","keep":true}'
    assert [json.loads(line) for line in text.splitlines()][1] == {
        "index": 11,
        "box": [None, -1e-09],
        "id": 8,
        "name": 'say "hi"',
        "keep": False,
    }


def test_a_predict_step_that_does_not_import_names_the_key() -> None:
    with pytest.raises(UsageError, match=r"train\.predict_step='my_pkg\.nope:f': importing"):
        columns.predict_step("my_pkg.nope:f")


def test_column_names_written_twice_are_named() -> None:
    found = table_of({"box": torch.zeros(2, 2), "box_1": [1, 2]})
    names = rows.step_columns({c.name: c.width for c in columns.schema(found)})
    clash = columns.clashes(step_returning(None), names)
    assert clash is not None
    assert "write the same CSV column name twice: ['box_1']" in clash.line()
    assert columns.clashes(step_returning(None), ["index", "box_0", "box_1"]) is None
