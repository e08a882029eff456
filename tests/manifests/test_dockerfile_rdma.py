"""The Dockerfile's RDMA step, run with stand-in apt-get, dpkg and rm: the CUDA image gets
Debian's verbs userspace, the CPU image does not, and a base that has it needs no network."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = "libibverbs1 ibverbs-providers librdmacm1"


def runtime_step() -> str:
    """The runtime stage's RUN that installs the verbs packages, as one shell line."""
    text = (ROOT / "Dockerfile").read_text().split("FROM base AS runtime", 1)[1]
    joined = text.replace("\\\n", " ")
    (step,) = [
        line for line in joined.splitlines() if line.startswith("RUN ") and "libibverbs1" in line
    ]
    return step.removeprefix("RUN ")


def run_step(tmp_path: Path, *, variant: str, installed: bool) -> list[str]:
    """Run the step with stand-ins that log their arguments; returns the log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    for name, code in (("apt-get", 0), ("rm", 0), ("dpkg", 0 if installed else 1)):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit {code}\n')
        tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VARIANT": variant}
    subprocess.run(["sh", "-ec", runtime_step()], env=env, check=True, timeout=30)
    return log.read_text().splitlines() if log.exists() else []


def test_the_cuda_image_installs_the_verbs_userspace_without_recommends(tmp_path: Path) -> None:
    calls = run_step(tmp_path, variant="cuda", installed=False)
    assert f"apt-get install -y --no-install-recommends {PACKAGES}" in calls
    # The .debs, apt's lists, caches and logs go: a base without debian:bookworm-slim's
    # docker-clean hook keeps them, and the caches would change the layer's bytes.
    assert "apt-get clean" in calls
    (removed,) = [call for call in calls if call.startswith("rm -rf ")]
    assert "/var/log/dpkg.log" in removed.split()
    assert any(path.startswith("/var/lib/apt/lists/") for path in removed.split())


def test_a_base_that_already_has_them_needs_no_network(tmp_path: Path) -> None:
    calls = run_step(tmp_path, variant="cuda", installed=True)
    assert calls == [f"dpkg -s {PACKAGES}"]


@pytest.mark.parametrize("installed", [False, True])
def test_the_cpu_image_goes_without(tmp_path: Path, installed: bool) -> None:
    assert run_step(tmp_path, variant="cpu", installed=installed) == []


def test_the_runtime_stage_knows_its_variant() -> None:
    stage = (ROOT / "Dockerfile").read_text().split("FROM base AS runtime", 1)[1]
    assert re.search(r"^ARG VARIANT=cuda$", stage, re.M)
