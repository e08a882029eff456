"""Hang evidence: the file a rank writes (all its threads' stacks), and the pure summary that
`trainbox hang` prints from many such files."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from trainbox import cli
from trainbox.watchdog import evidence, hang_report

LIB = "/usr/lib/python3.11"
TORCH = "/venv/site-packages/torch"


def text(
    rank: int,
    *,
    op: str = "the gradient all-reduce",
    step: int = 11,
    frames: tuple[tuple[str, int, str], ...] = (),
    world: int = 4,
    verdict: str = "rank 3 (n1) made no progress for 9 s in data loading at step 11",
) -> str:
    """An evidence file as evidence.render writes it; frames outermost first."""
    header = {
        "rank": rank, "world_size": world, "host": "n1", "pid": 100 + rank, "op": op,
        "step": step, "stuck_s": 9.0, "fell": "stuck", "blamed_rank": 3, "verdict": verdict,
        "library": f"{LIB}, {TORCH}",
    }  # fmt: skip
    body = [f'  File "{path}", line {line}, in {func}\n    pass' for path, line, func in frames]
    other = f'  File "{LIB}/threading.py", line 1, in run'
    head = "\n".join(f"{key}: {value}" for key, value in header.items())
    return f"{head}\n\nThread MainThread (ident 1) main:\n" + "\n".join(
        [*body, "", "Thread trainbox-watchdog (ident 2):", other, ""]
    )


LOOP = ("/src/trainbox/train/loop.py", 123, "fit")
BACKWARD = ("/src/trainbox/train/step_functions.py", 40, "backward")
IN_TORCH = (f"{TORCH}/autograd/__init__.py", 200, "backward")
USER = ("/home/u/my_model.py", 45, "load")
SLEEP = (f"{LIB}/time.py", 1, "sleep")


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [([0, 1, 2, 4, 5, 6, 7], "0-2,4-7"), ([3], "3"), ([0, 2, 4], "0,2,4"), ([9, 8], "8-9")],
)
def test_ranges_compress_consecutive_ranks(ranks: list[int], expected: str) -> None:
    assert hang_report.ranges(ranks) == expected


@pytest.mark.parametrize(
    ("frames", "where"),
    [
        # The innermost frame that is neither torch nor the standard library.
        ((LOOP, BACKWARD, IN_TORCH), "train/step_functions.py:40 in backward"),
        ((LOOP, USER, SLEEP), "u/my_model.py:45 in load"),
        ((IN_TORCH, SLEEP), "no Python frame of user or trainbox code"),
    ],
)
def test_the_innermost_user_or_trainbox_frame_is_where(
    frames: tuple[tuple[str, int, str], ...], where: str
) -> None:
    assert hang_report.parse(text(0, frames=frames)).where == where


def test_many_ranks_in_the_collective_share_one_line_and_the_stuck_one_has_its_own() -> None:
    files = {
        evidence.file_name(rank): text(rank, frames=(LOOP, BACKWARD, IN_TORCH), world=4096)
        for rank in range(4096)
        if rank != 3
    }
    files[evidence.file_name(3)] = text(
        3, op="data loading", frames=(LOOP, USER, SLEEP), world=4096
    )
    lines = hang_report.summarize(files)
    assert lines == [
        "verdict: rank 3 (n1) made no progress for 9 s in data loading at step 11",
        "rank 3: in data loading at step 11, at u/my_model.py:45 in load",
        "ranks 0-2,4-4095: in the gradient all-reduce at step 11,"
        " at train/step_functions.py:40 in backward",
        "first difference after train/loop.py:123 in fit:"
        " rank 3: u/my_model.py:45 in load; rank 0: train/step_functions.py:40 in backward",
    ]


@pytest.mark.parametrize(
    ("present", "line"),
    [
        ([0, 1], "no evidence from ranks 2-3 (exited, killed, or unable to run Python)"),
        ([0, 1, 3], "no evidence from rank 2 (exited, killed, or unable to run Python)"),
    ],
)
def test_ranks_without_a_file_are_named(present: list[int], line: str) -> None:
    files = {evidence.file_name(r): text(r, frames=(LOOP,)) for r in present}
    assert hang_report.summarize(files)[-1] == line


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, ["no hang evidence found"]),
        ({"rank-00000.txt": "garbage"}, ["rank-00000.txt: unreadable (not a header line: 'garbage')", "no hang evidence found"]),
        ({"rank-00000.txt": "rank: x\n\n"}, ["rank-00000.txt: unreadable (no rank in the header)", "no hang evidence found"]),
    ],
)  # fmt: skip
def test_unreadable_files_are_said_not_raised(files: dict[str, str], expected: list[str]) -> None:
    assert hang_report.summarize(files) == expected


def test_a_rank_writes_every_threads_stack_with_its_mark(tmp_path: Path) -> None:
    parked, release = threading.Event(), threading.Event()

    def park_here() -> None:
        parked.set()
        release.wait()

    helper = threading.Thread(target=park_here, name="helper")
    helper.start()
    parked.wait()
    try:
        header = {"rank": 7, "world_size": 8, "host": "n1", "pid": 1, "op": "data loading",
                  "step": 3, "verdict": "rank 7 (n1) made no progress"}  # fmt: skip
        path = evidence.write(tmp_path / "hang", header=header)
    finally:
        release.set()
        helper.join()
    assert path == tmp_path / "hang" / "rank-00007.txt"
    written = path.read_text()
    assert "Thread helper (ident" in written
    assert "in park_here" in written
    parsed = hang_report.parse(written)
    assert (parsed.rank, parsed.doing) == (7, "data loading at step 3")
    # The main thread is this test, the innermost frame outside the standard library and torch.
    assert parsed.where.startswith("unit/test_hang_evidence.py:")
    assert "in park_here" in written


def test_a_failed_collectives_traceback_stands_for_the_main_thread(tmp_path: Path) -> None:
    def collective() -> None:
        raise RuntimeError("timed out")

    try:
        collective()
    except RuntimeError as err:
        path = evidence.write(tmp_path, header={"rank": 0, "op": "x"}, main_tb=err.__traceback__)
    funcs = [frame.func for frame in hang_report.parse(path.read_text()).main]
    # The callers still running (pytest's), then the traceback down to where it raised.
    assert funcs[-2:] == [
        "test_a_failed_collectives_traceback_stands_for_the_main_thread",
        "collective",
    ]
    assert len(funcs) > 2


def test_trainbox_hang_without_evidence_is_exit_2_naming_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["hang", str(tmp_path)]) == 2
    assert f"{tmp_path / 'hang'} does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("dumps", "said"),
    [
        ([], False),
        (["nccl_trace_rank_0", "nccl_trace_rank_1"], True),
    ],
)
def test_trainbox_hang_points_to_nccl_flight_recorder_dumps_where_there_are_some(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dumps: list[str], said: bool
) -> None:
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / evidence.file_name(0)).write_text(text(0, frames=(LOOP,), world=1))
    for name in dumps:
        (hang / name).write_bytes(b"")
    assert cli.main(["hang", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict: ")
    line = f"NCCL Flight Recorder dumps from 2 rank(s); to match their collectives: torchfrtrace {hang} -p nccl_trace_rank_"
    assert (line in out) == said
