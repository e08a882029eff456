"""Fuzzed CSV files and data.args for the tabular task: usable tensors, or one clear line.

A file the task accepts gives finite inputs of the right width and targets that index its
classes; any other file is a UsageError (exit 2) whose one line names the file and a HINT.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from hypothesis import event, example, given
from hypothesis import strategies as st

from trainbox.errors import UsageError
from trainbox.tasks import tabular

from fuzzing import files_under, fuzz, scratch

COLUMNS = ["x1", "x2", "label", "Label", " label ", "", "x1", "1", '"a\nb"', "é", '"q"', '"l\rx"']
CELLS = [
    "0",
    "1",
    "-2.5",
    " 3 ",
    "1e3",
    "1e999",
    "nan",
    "-inf",
    "0x10",
    "1_000",
    "",
    "abc",
    "cat",
    "dog",
    "a,b",
    '"',
    '"x\ny"',
    "\x00",
    "\ufeff1",
    "1" * 400,
]


@st.composite
def plausible_csv(draw: st.DrawFn) -> bytes:
    """A CSV with a header x1,x2,label and numeric rows, now and then an odd cell."""
    cell = st.one_of(st.floats(min_value=-1e6, max_value=1e6).map(repr), st.sampled_from(CELLS[:6]))
    label = st.sampled_from(["cat", "dog", "1", "2", "cat "])
    rows = draw(st.lists(st.tuples(cell, cell, label), min_size=1, max_size=8))
    lines = ["x1,x2,label", *(",".join(row) for row in rows)]
    return ("\n".join(lines) + "\n").encode()


@st.composite
def wild_csv(draw: st.DrawFn) -> bytes:
    """CSV text as spreadsheets, scripts and accidents write it, as bytes."""
    width = draw(st.integers(min_value=0, max_value=4))
    header = draw(st.lists(st.sampled_from(COLUMNS), min_size=width, max_size=width))
    rows = draw(
        st.lists(
            st.lists(st.one_of(st.sampled_from(CELLS), st.text(max_size=6)), max_size=width + 1),
            max_size=8,
        )
    )
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = newline.join(",".join(row) for row in [header, *rows]) + draw(
        st.sampled_from(["", newline, newline * 3, ",,,\n"])
    )
    prefix = draw(st.sampled_from(["", "\ufeff"]))
    encoded = (prefix + text).encode("utf-8", errors="surrogatepass")
    return draw(st.one_of(st.just(encoded), st.binary(max_size=64)))


def csv_texts() -> st.SearchStrategy[bytes]:
    return st.one_of(plausible_csv(), wild_csv())


ARGS = st.fixed_dictionaries(
    {},
    optional={
        "target": st.sampled_from(["label", "label", "x1", "1", 1, "", None, ["label"]]),
        "features": st.sampled_from([None, [], ["x1"], ["x1", "x1"], ["label"], "x1", [1], {}]),
        "task": st.sampled_from(["classification", "regression", "", "nope", 1, ["x"]]),
    },
)


def assert_one_clear_line(err: UsageError, *paths: Path) -> None:
    line = err.line()
    assert err.exit_code == 2
    assert "\n" not in line, line
    assert "\r" not in line, line
    assert "HINT:" in line, line
    assert any(str(path) in line for path in paths) or "data.args." in line, line


@fuzz(200)
@given(train=csv_texts(), val=st.one_of(st.none(), csv_texts()), args=ARGS)
# A header cell or label holding a line break once split the error over two lines.
@example(train=b'"a\nb"\n0', val=None, args={})
@example(train=b'x1,label\n1,"c\rd"\n2,e\n', val=None, args={})
def test_a_csv_file_gives_usable_tensors_or_one_clear_line(
    train: bytes, val: bytes | None, args: dict[str, object]
) -> None:
    with scratch() as folder:
        train_csv, val_csv = folder / "train.csv", folder / "val.csv"
        train_csv.write_bytes(train)
        if val is not None:
            val_csv.write_bytes(val)
        before = files_under(folder)
        start = time.monotonic()
        try:
            made = tabular.data(
                train_csv=str(train_csv),
                val_csv=str(val_csv) if val is not None else None,
                **args,  # type: ignore[arg-type]
            )
        except UsageError as err:
            assert_one_clear_line(err, train_csv, val_csv)
        else:
            event("accepted")
            for part in (made.train, made.val):
                if part is None:
                    continue
                assert part.inputs.shape == (len(part), len(part.features))
                assert all(math.isfinite(v) for v in part.inputs.flatten().tolist())
                if part.classes:
                    assert 0 <= int(part.targets.min()) <= int(part.targets.max())
                    assert int(part.targets.max()) < len(part.classes)
        assert time.monotonic() - start < 5
        assert files_under(folder) == before
