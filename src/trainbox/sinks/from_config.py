"""The sinks `logging.tensorboard` and `logging.sinks` ask for: checked before a run starts,
then built for its run_dir."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from trainbox.errors import UsageError
from trainbox.sinks.runner import Sink


def check(*, tensorboard: bool, factories: Sequence[str]) -> None:
    """Raise one UsageError if a wanted sink's package or factory cannot be had."""
    from trainbox.config.factories import resolve

    problems: list[str] = []
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        problems.append("logging.tensorboard=true needs the tensorboard package (not installed)")
    for path in factories:
        try:
            resolve(path, key="logging.sinks")
        except UsageError as err:
            problems.extend(err.problems)
    if problems:
        raise UsageError(
            problems,
            hint="pip install 'trainbox[tensorboard]' or the sink's package into the image,"
            " or fix logging.* (docs/tracking.md)",
        )


def build(*, run_dir: Path, tensorboard: bool, factories: Sequence[str]) -> list[Sink]:
    """The sinks `logging.tensorboard` and `logging.sinks` ask for, each made for `run_dir`."""
    from trainbox.config.factories import resolve

    sinks: list[Sink] = []
    if tensorboard:
        from trainbox.sinks.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    for path in factories:
        sinks.append(resolve(path, key="logging.sinks")(run_dir))
    return sinks
