"""The image's locks agree with pyproject.toml, and pin every package by version and hash."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ("requirements-cpu.lock", "requirements-cuda.lock")
# `name==version [; marker] \` then `    --hash=sha256:<64 hex> [\]` lines.
PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)(?: ;[^\\]*)? \\$")
HASH = re.compile(r"^    --hash=sha256:[0-9a-f]{64}(?: \\)?$")


def pins(lock: str) -> dict[str, list[Version]]:
    """Each package's pinned versions (one per marker), failing on a pin without a hash."""
    found: dict[str, list[Version]] = {}
    current: str | None = None
    hashed: set[str] = set()
    for line in (ROOT / lock).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if match := PIN.match(line):
            current = canonicalize_name(match["name"])
            found.setdefault(current, []).append(Version(match["version"]))
        elif HASH.match(line) and current is not None:
            hashed.add(current)
        else:
            pytest.fail(f"{lock}: not a hashed pin: {line!r}")
    assert found.keys() == hashed, f"{lock}: pins without a hash: {found.keys() - hashed}"
    return found


# Extras the image holds besides the dependencies: `plot`, so that `trainbox report` works in it.
IMAGE_EXTRAS = ("plot",)


def dependencies() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [text for name in IMAGE_EXTRAS for text in project["optional-dependencies"][name]]
    return [Requirement(text) for text in [*project["dependencies"], *extras]]


@pytest.mark.parametrize("lock", LOCKS)
def test_every_dependency_of_pyproject_is_pinned_within_its_range(lock: str) -> None:
    locked = pins(lock)
    problems = []
    for dep in dependencies():
        versions = locked.get(canonicalize_name(dep.name), [])
        if not versions or not all(dep.specifier.contains(v, prereleases=True) for v in versions):
            problems.append(f"{dep} is {[str(v) for v in versions] or 'not locked'}")
    assert not problems, f"{lock} disagrees with pyproject.toml (run scripts/lock): {problems}"


def test_the_cpu_lock_has_cpu_torch_and_the_cuda_lock_its_gpu_libraries() -> None:
    cpu, cuda = pins(LOCKS[0]), pins(LOCKS[1])
    assert [str(v) for v in cpu["torch"]] == [f"{cuda['torch'][0]}+cpu"]
    assert not any(name.startswith("nvidia-") and name != "nvidia-ml-py" for name in cpu)
    assert {"triton", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"} <= cuda.keys()


def test_the_cuda_lock_pins_every_cpu_package_alike_and_adds_only_gpu_libraries() -> None:
    # The two images differ in torch's build alone: a package pinned apart would make a GPU
    # node and a CPU node run different code under the same trainbox version.
    cpu, cuda = pins(LOCKS[0]), pins(LOCKS[1])
    differing = {
        name: ([str(v) for v in versions], [str(v) for v in cuda.get(name, [])])
        for name, versions in cpu.items()
        if name != "torch" and cuda.get(name) != versions
    }
    assert differing == {}, f"run scripts/lock: the locks disagree on {differing}"
    extra = sorted(cuda.keys() - cpu.keys())
    assert [n for n in extra if not n.startswith(("nvidia-", "cuda-")) and n != "triton"] == []
