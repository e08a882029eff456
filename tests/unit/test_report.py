"""`trainbox report`: metrics.jsonl parsing, the PNG it draws, and every user-facing error."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from trainbox.commands.report import read_metrics, render
from trainbox.errors import UsageError

import tiers

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CUT_OFF = '{"kind": "train", "step": 410, "loss": 0.'


# The error paths that fail before drawing must work without the optional plot extra.
# In CI (TRAINBOX_REQUIRE_ALL=1) these run regardless, so a missing matplotlib fails loudly.
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None and not tiers.REQUIRE_ALL,
    reason="matplotlib (trainbox[plot]) missing",
)


def run_lines(val_metric: str = "val_accuracy", *, gpu: bool = False) -> list[str]:
    """A 400-step run logging train every 10 steps and val every 100, as JSON lines."""
    lines = []
    for step in range(10, 410, 10):
        train = {
            "kind": "train",
            "step": step,
            "epoch": step // 200,
            "loss": 2.0 / (1 + step / 50),
            "lr": 0.003 * min(1.0, step / 100),
            "samples_per_s": 800.0 + step % 70,
            "step_time_s": 0.078,
            "data_wait_share": 0.1 + (step % 30) / 100,
            "time": 1763769600.0 + step,
        }
        lines.append(json.dumps(train | ({"gpu_mem_mib": 1234.0} if gpu else {})))
        if step % 100 == 0:
            score = 0.5 + step / 1000 if val_metric == "val_accuracy" else 1.0 / step
            val = {"kind": "val", "step": step, "val_loss": 1.5 / (1 + step / 60)}
            lines.append(json.dumps(val | {val_metric: score, "val_samples": 2048, "time": 0.0}))
    return lines


def write_run(run_dir: Path, lines: list[str], tail: str = "") -> Path:
    """Write LINES (then TAIL with no newline, as a killed writer would) to RUN_DIR."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail, encoding="utf-8")
    return run_dir


@needs_matplotlib
@pytest.mark.parametrize("val_metric", ["val_accuracy", "val_mae"], ids=["classifier", "regressor"])
def test_render_writes_a_png_next_to_the_metrics(tmp_path: Path, val_metric: str) -> None:
    run_dir = write_run(tmp_path / "run", run_lines(val_metric, gpu=True))
    output = render(run_dir)
    assert output == run_dir / "report.png"
    data = output.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 20_000


@needs_matplotlib
def test_render_leaves_no_temp_files(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", run_lines())
    render(run_dir)
    render(run_dir)  # replacing an existing report goes through the temp file too
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl", "report.png"]


@needs_matplotlib
def test_render_tolerates_a_cut_off_last_line(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", run_lines(), tail=CUT_OFF)
    assert render(run_dir).read_bytes().startswith(PNG_SIGNATURE)


@needs_matplotlib
def test_render_writes_to_output_elsewhere(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", run_lines())
    (tmp_path / "plots").mkdir()
    output = render(run_dir, tmp_path / "plots" / "run.png")
    assert output == tmp_path / "plots" / "run.png"
    assert output.read_bytes().startswith(PNG_SIGNATURE)
    assert not (run_dir / "report.png").exists()


@pytest.mark.parametrize(
    ("lines", "tail", "bad_lines"),
    [
        (run_lines(), "", 0),
        (run_lines(), CUT_OFF, 0),
        (run_lines(), "\n\n", 0),
        (["{not json", *run_lines()], "", 1),
        ([*run_lines(), "[1, 2]"], CUT_OFF, 1),
        (run_lines(), '\n{"kind": "checkpoint", "step": 400, "path": "ckpt.pt"}\n', 0),
    ],
    ids=["clean", "cut-off-last", "blank-lines", "garbage-first", "non-object-mid", "unknown-kind"],
)
def test_read_metrics_counts_only_mid_file_bad_lines(
    tmp_path: Path, lines: list[str], tail: str, bad_lines: int
) -> None:
    metrics = read_metrics(write_run(tmp_path, lines, tail) / "metrics.jsonl")
    assert metrics.bad_lines == bad_lines
    assert metrics.train["loss"].steps == tuple(range(10, 410, 10))


@pytest.mark.parametrize(
    ("val_metric", "gpu", "val_keys", "extra_train_keys"),
    [
        ("val_accuracy", False, {"val_loss", "val_accuracy"}, set()),
        ("val_mae", True, {"val_loss", "val_mae"}, {"gpu_mem_mib"}),
    ],
)
def test_read_metrics_picks_val_metrics_and_train_curves(
    tmp_path: Path, val_metric: str, gpu: bool, val_keys: set[str], extra_train_keys: set[str]
) -> None:
    metrics = read_metrics(write_run(tmp_path, run_lines(val_metric, gpu=gpu)) / "metrics.jsonl")
    assert set(metrics.val) == val_keys
    assert metrics.val["val_loss"].steps == (100, 200, 300, 400)
    base = {"loss", "lr", "samples_per_s", "step_time_s", "data_wait_share"}
    assert set(metrics.train) == base | extra_train_keys


def test_summary_names_final_values_and_skipped_lines(tmp_path: Path) -> None:
    metrics = read_metrics(write_run(tmp_path, ["oops", *run_lines()]) / "metrics.jsonl")
    assert metrics.summary() == (
        "step 400 · loss 0.2222 · val_loss 0.1957 · val_accuracy 0.9 · 1 unparsable line(s) skipped"
    )


def _missing_run(tmp_path: Path) -> tuple[Path, Path | None, Path]:
    return tmp_path / "nope", None, tmp_path / "nope"


def _no_metrics_file(tmp_path: Path) -> tuple[Path, Path | None, Path]:
    (tmp_path / "run").mkdir()
    return tmp_path / "run", None, tmp_path / "run" / "metrics.jsonl"


def _no_train_line(tmp_path: Path) -> tuple[Path, Path | None, Path]:
    val_only = [line for line in run_lines() if '"val"' in line]
    run_dir = write_run(tmp_path / "run", val_only, tail=CUT_OFF)
    return run_dir, None, run_dir / "metrics.jsonl"


def _empty_metrics(tmp_path: Path) -> tuple[Path, Path | None, Path]:
    run_dir = write_run(tmp_path / "run", [])
    return run_dir, None, run_dir / "metrics.jsonl"


def _missing_output_dir(tmp_path: Path) -> tuple[Path, Path | None, Path]:
    return write_run(tmp_path / "run", run_lines()), tmp_path / "gone" / "r.png", tmp_path / "gone"


def _output_dir_is_a_file(tmp_path: Path) -> tuple[Path, Path | None, Path]:
    (tmp_path / "file").write_text("")
    return write_run(tmp_path / "run", run_lines()), tmp_path / "file" / "r.png", tmp_path / "file"


def _read_only_output_dir(tmp_path: Path) -> tuple[Path, Path | None, Path]:
    # /proc refuses new files even to root, unlike a chmod-ed directory.
    output = Path("/proc/trainbox-report.png")
    return write_run(tmp_path / "run", run_lines()), output, output


def _output_is_a_directory(tmp_path: Path) -> tuple[Path, Path | None, Path]:
    (tmp_path / "taken.png").mkdir()
    output = tmp_path / "taken.png"
    return write_run(tmp_path / "run", run_lines()), output, output


@pytest.mark.parametrize(
    "case",
    [
        _missing_run,
        _no_metrics_file,
        _no_train_line,
        _empty_metrics,
        _missing_output_dir,
        _output_dir_is_a_file,
        pytest.param(_read_only_output_dir, marks=needs_matplotlib),
        pytest.param(_output_is_a_directory, marks=needs_matplotlib),
    ],
)
def test_render_error_names_the_path(
    tmp_path: Path, case: Callable[[Path], tuple[Path, Path | None, Path]]
) -> None:
    run_dir, output, named = case(tmp_path)
    with pytest.raises(UsageError) as caught:
        render(run_dir, output)
    assert str(named) in str(caught.value)


@needs_matplotlib
def test_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    run_dir, output, _ = _output_is_a_directory(tmp_path)
    with pytest.raises(UsageError):
        render(run_dir, output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "taken.png"]


def test_missing_matplotlib_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry makes imports fail; submodules too, since earlier tests may have cached them.
    for name in [n for n in sys.modules if n.split(".")[0] == "matplotlib"] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(UsageError) as caught:
        render(write_run(tmp_path / "run", run_lines()))
    assert caught.value.problems == [
        "matplotlib is not installed, so `trainbox report` cannot draw"
    ]
    assert caught.value.hint == "pip install 'trainbox[plot]' (or matplotlib) into the image"


def _labels(axes: object) -> list[str]:
    return [text.get_text() for text in axes.get_legend().get_texts()]  # type: ignore[attr-defined]


def _figure_of(runs: dict[str, Path]) -> object:
    from matplotlib.figure import Figure

    from trainbox.commands.report import draw, read_metrics

    figure = Figure()
    metrics = {name: read_metrics(path / "metrics.jsonl") for name, path in runs.items()}
    draw(figure, "title", metrics)
    return figure


@needs_matplotlib
def test_several_runs_are_overlaid_one_colour_each(tmp_path: Path) -> None:
    runs = {name: write_run(tmp_path / name, run_lines()) for name in ("lr-a", "lr-b")}
    loss, val, lr = _figure_of(runs).axes[:3]  # type: ignore[attr-defined]
    assert _labels(loss) == [
        "lr-a: train loss (smoothed)", "lr-a: val_loss (at each eval)",
        "lr-b: train loss (smoothed)", "lr-b: val_loss (at each eval)",
    ]  # fmt: skip
    assert _labels(val) == ["lr-a: val_accuracy", "lr-b: val_accuracy"]
    assert _labels(lr) == ["lr-a: lr", "lr-b: lr"]
    colours = {line.get_label(): line.get_color() for line in loss.get_lines()}
    assert colours["lr-a: train loss (smoothed)"] != colours["lr-b: train loss (smoothed)"]


@needs_matplotlib
def test_a_noisy_loss_is_smoothed_and_the_raw_curve_kept_faint(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", run_lines())
    loss = _figure_of({"run": run}).axes[0]  # type: ignore[attr-defined]
    raw, smoothed = loss.get_lines()[:2]
    assert raw.get_alpha() < 0.5
    assert smoothed.get_label() == "train loss (smoothed)"
    assert list(smoothed.get_xdata()) == list(raw.get_xdata())


@needs_matplotlib
def test_eval_points_are_marked_at_their_steps(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", run_lines())
    loss = _figure_of({"run": run}).axes[0]  # type: ignore[attr-defined]
    (val_loss,) = [line for line in loss.get_lines() if line.get_label().startswith("val_loss")]
    assert val_loss.get_marker() == "o"
    assert list(val_loss.get_xdata()) == [100, 200, 300, 400]


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]), ([4.0], [4.0]), ([0.0, 10.0], [0.0, 5.263157894736842])],
)
def test_smoothing_is_a_debiased_moving_average(values: list[float], expected: list[float]) -> None:
    from trainbox.commands.report import smooth

    assert smooth(values, weight=0.9) == pytest.approx(expected)


def test_runs_that_share_a_folder_name_are_told_apart() -> None:
    from trainbox.commands.report import names

    assert names([Path("a/run"), Path("b/run"), Path("c/other")]) == ["a/run", "b/run", "other"]


@needs_matplotlib
def test_the_cli_draws_several_runs_into_one_png(tmp_path: Path) -> None:
    import subprocess

    for name in ("one", "two"):
        write_run(tmp_path / name, run_lines())
    proc = subprocess.run([sys.executable, "-m", "trainbox", "report", "one", "two"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "report.png"
    assert (tmp_path / "report.png").read_bytes().startswith(PNG_SIGNATURE)


def timed_lines() -> list[str]:
    """run_lines() with each window's spread of per-rank compute, and one straggler record."""
    lines = []
    for line in run_lines():
        record = json.loads(line)
        if record["kind"] == "train":
            slow = record["step"] >= 200
            record |= {"compute_s_min": 0.010, "compute_s_p50": 0.011,
                       "compute_s_max": 0.040 if slow else 0.012, "own_s_p50": 0.012,
                       "own_s_max": 0.045 if slow else 0.013, "slowest_rank": 2}  # fmt: skip
        lines.append(json.dumps(record))
    straggler = {"kind": "straggler", "step": 220, "rank": 2, "host": "node7", "cause": "compute",
                 "ratio": 3.6, "median_s": 0.011, "rank_s": 0.040}  # fmt: skip
    return [*lines, json.dumps(straggler)]


def test_read_metrics_keeps_straggler_records(tmp_path: Path) -> None:
    metrics = read_metrics(write_run(tmp_path, timed_lines()) / "metrics.jsonl")
    (straggler,) = metrics.stragglers
    assert (straggler.step, straggler.label(), straggler.cause) == (
        220,
        "rank 2 (node7)",
        "compute",
    )
    assert "slowest_rank" not in metrics.train, "a rank number is not a curve"


@needs_matplotlib
def test_per_rank_step_times_get_a_panel_that_marks_the_straggler(tmp_path: Path) -> None:
    figure = _figure_of({"run": write_run(tmp_path / "run", timed_lines())})
    axes = figure.axes  # type: ignore[attr-defined]
    (steps,) = [one for one in axes if one.get_title() == "Per-rank compute per step"]
    assert _labels(steps) == ["fastest to slowest rank", "median rank", "slowest rank",
                              "the rank waited for: its own time", "wall step time",
                              "straggler named"]  # fmt: skip
    assert [text.get_text() for text in steps.texts] == ["rank 2 (node7): compute"]


@needs_matplotlib
def test_a_run_without_step_times_keeps_the_four_panels(tmp_path: Path) -> None:
    figure = _figure_of({"run": write_run(tmp_path / "run", run_lines())})
    titles = [axes.get_title() for axes in figure.axes]  # type: ignore[attr-defined]
    assert "Per-rank compute per step" not in titles
    assert titles[:4] == ["Loss", "Validation metrics (at each eval)", "Learning rate",
                          "Throughput"]  # fmt: skip


def recovered_lines() -> list[str]:
    """run_lines() with one in-place recovery record (dist.recovery=in_process)."""
    recovery = {"kind": "recovery", "step": 150, "generation": 1, "rank": 3, "node": "node7",
                "cause": "SIGKILL", "seconds": 0.84, "steps_retrained": 1, "time": 0.0}  # fmt: skip
    return [*run_lines(), json.dumps(recovery)]


def test_read_metrics_keeps_recovery_records(tmp_path: Path) -> None:
    metrics = read_metrics(write_run(tmp_path, recovered_lines()) / "metrics.jsonl")
    (recovery,) = metrics.recoveries
    assert (recovery.step, recovery.label()) == (150, "rank 3: SIGKILL, 0.8 s")
    assert "seconds" not in metrics.train, "a recovery's figures are not a curve"


@needs_matplotlib
def test_the_loss_panel_marks_each_recovery(tmp_path: Path) -> None:
    figure = _figure_of({"run": write_run(tmp_path / "run", recovered_lines())})
    (loss,) = [one for one in figure.axes if one.get_title() == "Loss"]  # type: ignore[attr-defined]
    assert "rank replaced in place" in _labels(loss)
    assert [text.get_text() for text in loss.texts] == ["rank 3: SIGKILL, 0.8 s"]
