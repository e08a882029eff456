"""The image under Apptainer's rules, run directly by the stand-in (tests/container/bin/apptainer):
read-only, as a uid the image does not know, with HOME, /tmp and the working directory bound.
The sbatch scripts under the same rules: test_slurm_scripts.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from container import standin

pytestmark = pytest.mark.slow

UID = 4250
QUICK = ["train.max_steps=10", "train.eval_every=10", "train.ckpt_every=10"]


@pytest.fixture
def user() -> Iterator[standin.User]:
    with standin.user(UID) as made:
        yield made


def apptainer(
    user: standin.User, *args: str, definition: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`apptainer run ARGS` from the user's working directory, as that user."""
    extra = {} if definition is None else {"TRAINBOX_APPTAINER_DEF": definition}
    return subprocess.run(
        [str(standin.STAND_IN / "apptainer"), "run", *args],
        cwd=user.work, env={**user.env(), **extra},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_run_dir_inside_the_read_only_image_exits_2_naming_it(
    user: standin.User, built_image: str
) -> None:
    # Exit 2, not 3: run_dir is the user's setting (docs/cli.md, docs/preflight.md).
    proc = apptainer(user, built_image, "run", "run_dir=/opt/trainbox/runs/x", *QUICK)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error: ")]
    assert errors == [
        "trainbox: error: run_dir: run_dir='/opt/trainbox/runs/x' is not writable "
        "(/opt/trainbox is on a read-only file system). "
        "HINT: point run_dir at a writable, mounted directory"
    ], proc.stderr[-3000:]
    assert user.written(allowed=[]) == []


def test_a_run_writes_only_run_dir_and_the_compile_cache_it_logs(
    user: standin.User, built_image: str
) -> None:
    run_dir = user.work / "run"
    proc = apptainer(user, built_image, "run", f"run_dir={run_dir}", *QUICK)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cache = user.home / ".cache" / "trainbox" / "torchinductor"
    logged = [json.loads(line) for line in proc.stderr.splitlines() if '"compile cache"' in line]
    assert [(e["path"], e["source"]) for e in logged] == [(str(cache), "HOME")]
    assert (run_dir / "summary.json").is_file()
    assert user.written(allowed=[run_dir, cache]) == []


def test_a_sif_converted_from_the_oci_image_runs_its_entrypoint_quietly(
    user: standin.User, built_image: str
) -> None:
    # No definition file: Apptainer's runscript is ENTRYPOINT + ARGS, and tini is not PID 1.
    proc = apptainer(user, built_image, "doctor", definition="none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no NVIDIA driver, CPU mode" in proc.stdout + proc.stderr
    assert "tini" not in proc.stderr, proc.stderr[-3000:]
