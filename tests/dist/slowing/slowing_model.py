"""A test model whose training steps turn slow after a number of steps (and whose eval is slow).

Used by tests/dist/test_stop_latency.py to change the step time mid-run, the case a stop
schedule estimated from past step times gets wrong.
"""

from __future__ import annotations

import time

import torch

from trainbox.tasks import spirals


class Slowing(torch.nn.Module):
    """The built-in MLP; training forwards after `after` of them sleep `sleep_s` each."""

    def __init__(self, *, after: int, sleep_s: float, eval_sleep_s: float, hidden: int) -> None:
        super().__init__()
        self.net = spirals.model(hidden=hidden)
        self.after, self.sleep_s, self.eval_sleep_s = after, sleep_s, eval_sleep_s
        self.calls = 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls > self.after:
                time.sleep(self.sleep_s)
        else:
            time.sleep(self.eval_sleep_s)
        return self.net(inputs)


def model(
    after: int = 10**9, sleep_s: float = 0.0, eval_sleep_s: float = 0.0, hidden: int = 128
) -> Slowing:
    return Slowing(after=after, sleep_s=sleep_s, eval_sleep_s=eval_sleep_s, hidden=hidden)
