"""Train your own model and data objects with trainbox's Python API (no factories).

The same loop, checkpoints, preemption handling and output files as `trainbox run`. Put the
script behind `trainbox exec` (any launcher) or run it under torchrun:

    export PYTHONPATH=examples/user_model      # where my_model lives (or pip install it)
    trainbox exec -- python examples/api_script.py [key=value ...]
    torchrun --nproc-per-node 2 examples/api_script.py
    srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/api_script.py

It gives the same params_sha256 as its `trainbox run` twin with the same overrides:

    trainbox run --config examples/user_model/config.yaml [key=value ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from my_model.factories import SignalNet, Signals

import trainbox

CONFIG = Path(__file__).parent / "user_model" / "config.yaml"


def main(overrides: list[str]) -> int:
    config = trainbox.load_config(CONFIG, overrides)
    # seed=: every rank seeds alike before the model is built, so all start from one set of weights.
    with trainbox.init_distributed(timeout_s=config.dist.timeout_s, seed=config.seed) as session:
        model = SignalNet(**config.model.args)
        shape = {"length": 128, "noise": 1.0}
        data = trainbox.Datasets(
            train=Signals(4000, seed=1234, **shape), val=Signals(1000, seed=1235, **shape)
        )
        try:
            summary = trainbox.Trainer(config, session, model=model, data=data).fit()
        except trainbox.Stopped as stop:
            # Preempted after a checkpoint: 143 tells the scheduler to start us again.
            print(f"api_script: {stop.line()}", file=sys.stderr)
            return stop.exit_code
    if session.context.rank == 0:
        print(f"trained {summary.steps} steps: params_sha256={summary.params_sha256}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
