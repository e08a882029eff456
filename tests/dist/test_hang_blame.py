"""A rank killed with SIGKILL mid-run among 12 hand-started ranks: every survivor exits 4 and
names the killed rank, not a peer that merely fell earlier in the cascade, on one short line.

No agent between the ranks (the `env` launcher): rank 0 hosts the store, and each rank's own
exit code and error line are seen.
"""

from __future__ import annotations

import pytest

from runs import QUICK, by_hand

pytestmark = pytest.mark.slow

WORLD = 12
VICTIM = 7
# Long enough for 12 ranks to join on a loaded 2-CPU machine; the kill cascades faster.
TIMEOUT_S = 30
CONFIG = [*QUICK, "train.max_steps=30", "train.log_every=10", f"dist.timeout_s={TIMEOUT_S}"]
# A line a person reads whole: the verdict and the hint (about 260), not gloo's paragraph.
SHORT = 500


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("trainbox: error:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_every_survivor_names_the_killed_rank_on_a_short_line(tmp_path: object) -> None:
    results = by_hand(
        "run",
        f"run_dir={tmp_path}",
        *CONFIG,
        world=WORLD,
        env={"TRAINBOX_FAULT": f"kill:rank={VICTIM}:step=8", "PYTHONUNBUFFERED": "1"},
    )
    said = {rank: [line for line in err.splitlines() if line.startswith("trainbox: error:")]
            for rank, (_, err) in enumerate(results)}  # fmt: skip
    assert results[VICTIM][0] == -9, said
    survivors = {rank: result for rank, result in enumerate(results) if rank != VICTIM}
    codes = {rank: code for rank, (code, _) in survivors.items()}
    odd = {rank: err[-2500:] for rank, (code, err) in survivors.items() if code != 4}
    assert codes == dict.fromkeys(survivors, 4), odd
    lines = {rank: error_line(stderr) for rank, (_, stderr) in survivors.items()}
    wrong = {rank: line for rank, line in lines.items() if f"rank {VICTIM} (" not in line}
    assert not wrong, "\n".join(f"{rank}: {line}" for rank, line in wrong.items())
    long = {rank: len(line) for rank, line in lines.items() if len(line) > SHORT}
    assert not long, f"lines over {SHORT} characters: {long}\n{lines[min(long)]}"
