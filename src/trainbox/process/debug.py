"""What `--debug` turns on: distributed debugging variables, each only where the user set none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Variable:
    """One environment variable `--debug` sets."""

    # The variable's name.
    name: str
    # The value it gets when the user has not set it.
    value: str
    # Only when this process sees a GPU (it does nothing, or costs for nothing, on CPU).
    gpu_only: bool = False


# Order is the order the troubleshooting table in docs/troubleshooting.md explains them in.
VARIABLES = (
    # Collective checks across ranks (mismatched op, shape or order), DDP's unused-parameter report.
    Variable(name="TORCH_DISTRIBUTED_DEBUG", value="DETAIL"),
    # c10d's own INFO lines (rendezvous, store keys, the debug level): hidden below WARNING.
    Variable(name="TORCH_CPP_LOG_LEVEL", value="INFO"),
    # NCCL says which transport, interface and rings it chose, and each collective it runs.
    Variable(name="NCCL_DEBUG", value="INFO"),
    Variable(name="NCCL_DEBUG_SUBSYS", value="INIT,COLL,NET"),
    # A failed or timed-out NCCL collective ends the process with an error instead of a hang.
    Variable(name="TORCH_NCCL_ASYNC_ERROR_HANDLING", value="1"),
    # Errors raised in C++ carry the C++ stack, not just the Python one.
    Variable(name="TORCH_SHOW_CPP_STACKTRACES", value="1"),
    # Kernels run synchronously, so a CUDA error points at the op that caused it (slow).
    Variable(name="CUDA_LAUNCH_BLOCKING", value="1", gpu_only=True),
    # trainbox's own debug lines.
    Variable(name="TRAINBOX_LOG_LEVEL", value="debug"),
)


# What TORCH_DISTRIBUTED_DEBUG gets instead of DETAIL where a DDP model runs over gloo.
GLOO_DDP_LEVEL = "INFO"


def debug_env(env: Mapping[str, str], *, gpu: bool, ddp_over_gloo: bool = False) -> dict[str, str]:
    """The variables `--debug` adds to `env`; one the user already set (even empty) is kept.

    `ddp_over_gloo`: DETAIL wraps gloo in a checking process group that DDP's constructor
    (c10d::Logger::set_env_variables, torch 2.13) casts to ProcessGroupGloo: a segfault.
    """
    wanted = {v.name: v.value for v in VARIABLES if gpu or not v.gpu_only}
    if ddp_over_gloo:
        wanted["TORCH_DISTRIBUTED_DEBUG"] = GLOO_DDP_LEVEL
    return {name: value for name, value in wanted.items() if name not in env}
