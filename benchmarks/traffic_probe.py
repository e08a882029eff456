"""Run a Python module or script as this process and count the collectives it makes.

    torchrun ... benchmarks/traffic_probe.py OUT_DIR -m trainbox run ...
    torchrun ... benchmarks/rss_probe.py OUT_DIR benchmarks/traffic_probe.py OUT_DIR -m trainbox ...

Once the program imports torch.distributed (the probe imports nothing of torch itself, so
trainbox's CPU plan still comes first), its tensor collectives are wrapped, in the package and in
distributed_c10d: all_gather_single and all_gather_into_tensor, reduce_scatter_single and
reduce_scatter_tensor, all_reduce and broadcast. Each call is counted by kind, group ranks,
bytes and calling module; nothing else changes. Each rank writes OUT_DIR/traffic-RANK.json at
exit: {"rank", "node", "calls": [{kind, ranks, bytes, source, count}], "cuda_peak_bytes"}. A call's
bytes are the whole tensor its group shares: an all-gather's output, a reduce-scatter's input,
an all-reduce's or a broadcast's tensor.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import sys
import threading
import types
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import rss_probe

# torch.distributed's function -> (the kind of collective, the argument whose bytes count).
WRAPPED = {
    "all_gather_single": ("all_gather", "output_tensor"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
}
# (kind, group ranks, bytes, calling module) -> calls on this rank.
CALLS: Counter[tuple[str, tuple[int, ...], int, str]] = Counter()
# Calls under way on this thread: a deprecated name calls its new one, which must not count again.
_DEPTH = threading.local()


def counted(fn: Callable[..., Any], kind: str, argument: str) -> Callable[..., Any]:
    """`fn`, each outermost call counted in CALLS by kind, group ranks, bytes and caller."""
    import torch.distributed as dist

    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_DEPTH, "value", 0)
        if depth == 0:
            given = signature.bind(*args, **kwargs).arguments
            tensor, group = given[argument], given.get("group")
            ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
            caller = sys._getframe(1).f_globals.get("__name__", "?")
            CALLS[(kind, ranks, tensor.numel() * tensor.element_size(), caller)] += 1
        _DEPTH.value = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH.value = depth

    return wrapper


def patch(package: types.ModuleType) -> None:
    """Wrap the collectives of `package` (torch.distributed) and of its distributed_c10d."""
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    for name, (kind, argument) in WRAPPED.items():
        original = getattr(c10d, name, None)
        if original is None:  # the *_single names are new in torch 2.13
            continue
        wrapper = counted(original, kind, argument)
        for module in (package, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds torch.distributed as the other finders do, and patches it once it has run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        del target  # the import system's hint for reloads; a fresh import has none
        if fullname != "torch.distributed":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        sys.meta_path.remove(self)
        patch(module)


def record(out: Path) -> None:
    """This rank's counted calls (and CUDA's peak allocation, if it ran), as traffic-RANK.json."""
    rank = int(os.environ.get("RANK", "0"))
    calls = [{"kind": kind, "ranks": list(ranks), "bytes": size, "source": source,
              "count": count}
             for (kind, ranks, size, source), count in sorted(CALLS.items())]  # fmt: skip
    torch = sys.modules.get("torch")
    peak = None
    if torch is not None and torch.cuda.is_initialized():
        peak = torch.cuda.max_memory_allocated()
    # The node torchrun's rendezvous put this rank on, to hold against rank // ranks per node.
    node = int(os.environ.get("GROUP_RANK", "0"))
    data = {"rank": rank, "node": node, "calls": calls, "cuda_peak_bytes": peak}
    (out / f"traffic-{rank}.json").write_text(json.dumps(data))


def main() -> None:
    out, rest = Path(sys.argv[1]), sys.argv[2:]
    atexit.register(record, out)
    if "torch.distributed" in sys.modules:
        patch(sys.modules["torch.distributed"])
    else:
        sys.meta_path.insert(0, _PatchOnImport())
    rss_probe.become(rest)


if __name__ == "__main__":
    main()
