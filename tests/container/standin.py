"""A user for the Apptainer stand-in (tests/container/bin/apptainer): a uid that neither the
image nor this host knows, as a cluster user is, with a home and a working directory of its own.

The tests run as root, which is in every image's /etc/passwd; the stand-in runs the container as
the uid in TRAINBOX_APPTAINER_USER instead. Everything that uid owns afterwards under /tmp,
/var/tmp and /dev/shm (its home and working directory included, as they live under /tmp) is what
the job wrote outside the image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

STAND_IN = Path(__file__).parent / "bin"
# Where a job can write at all: Apptainer binds these and the user's home and working directory.
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")


@dataclass(frozen=True)
class User:
    uid: int
    root: Path  # root-owned, world-readable: home/, work/ and runs/ (the user's) and test files

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def env(self) -> dict[str, str]:
        """What the user's session has: its HOME; and the stand-in first on PATH, told whom."""
        return {
            "PATH": f"{STAND_IN}:{os.environ['PATH']}",
            "HOME": str(self.home),
            "TRAINBOX_APPTAINER_USER": f"{self.uid}:{self.uid}",
        }

    def written(self, *, allowed: Sequence[Path]) -> list[str]:
        """What the uid owns under SCRATCH, but its own three folders, `allowed` and whatever is
        below or above an allowed path (the folders that hold it)."""
        found = subprocess.run(
            ["find", *SCRATCH, "-xdev", "-uid", str(self.uid), "-print"],
            capture_output=True, text=True, check=False,
        ).stdout.split("\n")  # fmt: skip
        own = {self.home, self.work, self.runs}

        def expected(path: Path) -> bool:
            return path in own or any(
                path == ok or ok in path.parents or path in ok.parents for ok in allowed
            )

        return sorted(line for line in found if line and not expected(Path(line)))


@contextmanager
def user(uid: int) -> Iterator[User]:
    """A fresh user `uid` with an empty home, working directory and runs folder; removed after."""
    root = Path(tempfile.mkdtemp(prefix=f"trainbox-user{uid}-", dir="/tmp"))
    root.chmod(0o755)
    made = User(uid, root)
    try:
        for folder in (made.home, made.work, made.runs):
            folder.mkdir()
            os.chown(folder, uid, uid)
        yield made
    finally:
        shutil.rmtree(root, ignore_errors=True)
