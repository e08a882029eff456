"""Fuzzed `trainbox exec` command lines: the user's command exactly, or one refusal.

`exec [--config FILE] [--debug] [key=value ...] -- CMD ...` hands CMD over unchanged (every word,
in order, whatever it looks like); anything else is exit 2. The hand-over and pinning are
replaced by stand-ins that record what would have run: this process must stay itself.
"""

from __future__ import annotations

from unittest import mock

from hypothesis import example, given
from hypothesis import strategies as st

from trainbox.process import exec_plan

from fuzzing import Outcome, assert_refused, fuzz, invoke, scratch

# Words a command line may hold: options of trainbox and of the user's program, overrides
# good and bad, separators, and text of any kind (argv holds no NUL).
WORDS = st.one_of(
    st.sampled_from(
        [
            "--",
            "--config",
            "--debug",
            "--help",
            "-h",
            "--version",
            "-x",
            "--lr=1",
            "python",
            "-c",
            "pass",
            "seed=1",
            "seed=x",
            "train.max_steps=0",
            "nope.key=1",
            "=1",
            "a=",
            "dist.procs_per_node=2",
            "model.args={",
            "",
            " ",
            "é",
        ]
    ),
    st.text(st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]), max_size=10),
)
OVERRIDES = st.sampled_from(["seed=1", "seed=x", "train.max_steps=3", "nope=1", "model.args.a=1"])


def run_exec(words: list[str]) -> tuple[Outcome, list[exec_plan.ExecPlan]]:
    handed: list[exec_plan.ExecPlan] = []

    def hand_over(target: exec_plan.ExecPlan, **_: object) -> int:
        handed.append(target)
        return 0

    with (
        mock.patch("trainbox.process.launching.pin"),
        mock.patch("trainbox.process.launching.replace_process", hand_over),
        mock.patch("trainbox.process.launching.supervise_workers", hand_over),
    ):
        return invoke(["exec", *words]), handed


def assert_clean(outcome: Outcome, handed: list[exec_plan.ExecPlan]) -> None:
    assert "Traceback" not in outcome.stderr, outcome.stderr
    if "usage:" in outcome.stderr or outcome.stdout.startswith("usage:"):
        assert outcome.code in (0, 2), outcome  # argparse: --help, or its own usage error
        assert not handed
    elif outcome.code == 0:
        assert len(handed) == 1
    else:
        assert_refused(outcome, within_s=5)
        assert not handed


@fuzz(150)
@given(words=st.lists(WORDS, max_size=8))
def test_any_exec_command_line_hands_over_or_is_refused(words: list[str]) -> None:
    outcome, handed = run_exec(words)
    assert_clean(outcome, handed)


@fuzz(100)
@given(
    overrides=st.lists(OVERRIDES, max_size=3),
    command=st.lists(WORDS, min_size=1, max_size=6),
    config=st.sampled_from([None, "seed: 2\n", "seed: [\n", "model:\n  args: {x: &a [*a]}\n"]),
)
@example(overrides=[], command=["python", "--", "-c", "pass"], config=None)
def test_the_command_after_the_separator_is_handed_over_word_for_word(
    overrides: list[str], command: list[str], config: str | None
) -> None:
    with scratch() as folder:
        flags = []
        if config is not None:
            (folder / "c.yaml").write_text(config)
            flags = ["--config", str(folder / "c.yaml")]
        outcome, handed = run_exec([*flags, *overrides, "--", *command])
    assert_clean(outcome, handed)
    # The last value given for a key wins; an unknown key or bad file is refused whatever else.
    seeds = [item for item in overrides if item.startswith("seed=")]
    bad_input = (
        "nope=1" in overrides
        or seeds[-1:] == ["seed=x"]
        or (config is not None and config != "seed: 2\n")
    )
    assert outcome.code == (2 if bad_input else 0), outcome
    if outcome.code == 0:
        assert handed[0].argv == tuple(command)
