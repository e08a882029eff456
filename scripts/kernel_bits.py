"""Print a short hash of each CPU kernel the training math runs, to find where two machines part.

    .venv/bin/python scripts/kernel_bits.py > mine.json           # on each machine
    .venv/bin/python scripts/kernel_bits.py --diff theirs.json     # the kernels that differ

It runs with the portable settings of tests/dist/test_pinned_fingerprints.py unless the
environment already sets them; pass --native to run with none. Each kernel gets fixed inputs
from a seeded generator (torch's CPU generator gives the same numbers everywhere), so a
different hash means the kernel itself computed other bits. The shapes are those of the
built-in example's MLP (batch 64, 2 → 128 → 128 → 5), forward and backward. docs/training.md
(Reproducibility) gives what it found between an Intel Xeon and an AMD EPYC.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # torch loads only after main() has made sure of the settings, which it reads at load.
    import torch

PORTABLE = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# (rows, inner, columns) of every matrix product in the example MLP's forward and backward.
PRODUCTS = [(64, 2, 128), (64, 128, 128), (64, 128, 5), (64, 5, 128), (5, 64, 128),
            (128, 64, 128), (128, 64, 2)]  # fmt: skip


def kernels() -> dict[str, str]:
    """Each kernel's name and the first 12 hex digits of the SHA-256 of its output's bytes."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(1)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    x = randn(8192)
    cases: dict[str, Callable[[], torch.Tensor]] = {
        "rand": lambda: torch.rand(8192, generator=torch.Generator().manual_seed(2)),
        "randn": lambda: x,
        "sin": lambda: torch.sin(x * 7),
        "exp": lambda: torch.exp(x),
        "log": lambda: torch.log(x.abs() + 1e-3),
        "sqrt": lambda: torch.sqrt(x.abs()),
        "tanh": lambda: torch.tanh(x),
        "sum": lambda: x.view(64, 128).sum(0),
        "vector_norm": lambda: torch.linalg.vector_norm(x),
    }
    for rows, inner, cols in PRODUCTS:
        a, b, bias = randn(rows, inner), randn(inner, cols), randn(cols)
        name = f"{rows}x{inner}x{cols}"
        cases[f"mm {name}"] = lambda a=a, b=b: a @ b
        cases[f"mm {name} b-transposed"] = lambda a=a, b=b: a @ b.t().contiguous().t()
        cases[f"addmm {name}"] = lambda a=a, b=b, bias=bias: torch.addmm(bias, a, b)
    logits, labels = randn(64, 5), torch.randint(0, 5, (64,), generator=generator)
    cases["cross_entropy"] = lambda: F.cross_entropy(logits, labels)
    signal, weight = randn(8, 4, 128), randn(16, 4, 5)
    cases["conv1d"] = lambda: F.conv1d(signal, weight, padding=2)
    cases["adamw 3 steps"] = lambda: _adamw(randn(128, 128), randn(128, 128))
    return {name: _digest(make()) for name, make in cases.items()}


def _adamw(start: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    import torch

    param = torch.nn.Parameter(start)
    param.grad = grad
    optimizer = torch.optim.AdamW([param], lr=1e-3)
    for _ in range(3):
        optimizer.step()
    return param.detach()


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:12]


def report() -> dict[str, Any]:
    """This machine's processor, the settings in force and every kernel's hash."""
    import torch

    from trainbox.affinity import processor

    cpu = processor.read()
    settings = {name: os.environ.get(name, "") for name in PORTABLE}
    return {"cpu_kind": cpu.kind, "cpu_model": cpu.model, "torch": torch.__version__,
            "settings": settings, "kernels": kernels()}  # fmt: skip


def differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """One line per kernel whose hash differs (or that only one side has)."""
    ours, other = mine["kernels"], theirs["kernels"]
    return [
        f"{name}: {ours.get(name, '-')} here, {other.get(name, '-')} there"
        for name in sorted(ours.keys() | other.keys())
        if ours.get(name) != other.get(name)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diff", type=Path, help="another machine's output: list what differs")
    parser.add_argument("--native", action="store_true", help="run without the portable settings")
    args = parser.parse_args()
    wanted = {} if args.native else PORTABLE
    if any(os.environ.get(name) != value for name, value in wanted.items()):
        # The settings are read when torch loads its libraries: start again with them set.
        os.execve(sys.executable, [sys.executable, *sys.argv], os.environ | wanted)
    mine = report()
    if args.diff is None:
        print(json.dumps(mine, indent=1))
        return 0
    theirs = json.loads(args.diff.read_text())
    for key in ("cpu_kind", "cpu_model", "torch", "settings"):
        print(f"{key}: {mine[key]} here, {theirs[key]} there")
    lines = differences(mine, theirs)
    print(*lines or ["every kernel computed the same bits"], sep="\n")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
