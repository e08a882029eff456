"""The progress bar draws only for a person at a terminal."""

from __future__ import annotations

import io

from trainbox.train.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_draws_on_a_terminal() -> None:
    stream = Terminal()
    progress = Progress(100, enabled=True, stream=stream)
    progress.update(50, loss=0.5)
    progress.close()
    text = stream.getvalue()
    assert text.startswith("\r[" + "#" * 15 + "." * 15 + "] 50/100  loss 0.5")
    assert text.endswith("\n")


def test_silent_off_a_terminal_or_off_rank_zero() -> None:
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        progress = Progress(10, enabled=enabled, stream=stream)
        progress.update(5, loss=1.0)
        progress.close()
        assert stream.getvalue() == ""
