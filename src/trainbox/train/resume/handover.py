"""dist.recovery=in_process: once the group is re-formed, the furthest survivor hands its training
state to every rank that is behind it, in memory, as a checkpoint would hold it.

Under DDP every survivor holds the whole model and optimizer state. A survivor may be one step
ahead of another (the dead rank's last gradients reached some before it died), so the state of
the furthest one wins and the others take it: no rank steps back, and the step in flight when
the rank died is the only one trained again. RNG streams are not handed over: under
dist.recovery=in_process each step draws from a stream seeded by (seed, rank, step)
(train/resume/determinism.py), which a new process can rebuild.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist

from trainbox.checkpoint import schema
from trainbox.errors import DistributedError
from trainbox.train.resume.state import TrainState, restore_user_state


@dataclass(frozen=True, kw_only=True, slots=True)
class Handover:
    """What the hand-over agreed."""

    # The step every rank now stands at.
    step: int
    # The rank whose state everyone took.
    source: int
    # The largest step any rank had begun, less `step`: optimizer steps trained again.
    steps_lost: int
    # Bytes the source sent (0: nobody was behind it).
    sent_bytes: int


def hand_over(
    state: TrainState, *, joining: bool, in_flight: int, rank: int, world_size: int
) -> Handover:
    """Collective: every rank ends at the furthest survivor's state (`in_flight`: the step this
    rank had begun when the group broke; a joining spare has none)."""
    device = _wire_device()
    mine = -1 if joining else state.step
    furthest = _reduce(mine, torch_dist.ReduceOp.MAX, device)
    if furthest < 0:
        raise DistributedError(
            "no rank survived to hand the training state over",
            hint="the run resumes from its newest checkpoint when started again",
        )
    source = _reduce(rank if mine == furthest else world_size, torch_dist.ReduceOp.MIN, device)
    begun = _reduce(max(in_flight, mine), torch_dist.ReduceOp.MAX, device)
    behind = _reduce(int(mine != furthest), torch_dist.ReduceOp.SUM, device)
    sent = 0
    if behind:
        blob = _serialised(state) if rank == source else b""
        blob, sent = _broadcast(blob, source, device)
        if mine != furthest:
            _restore(state, blob, rank=rank, world_size=world_size, joining=joining)
    return Handover(step=furthest, source=source, steps_lost=begun - furthest, sent_bytes=sent)


def _serialised(state: TrainState) -> bytes:
    payload = state.payload(config={}, config_hash="", rng=[])
    buffer = io.BytesIO()
    torch.save(payload.to_dict(), buffer)
    return buffer.getvalue()


def _restore(state: TrainState, blob: bytes, *, rank: int, world_size: int, joining: bool) -> None:
    raw = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    payload = schema.read(raw)
    source = "the survivors' memory"
    state.restore(payload, source=source, changed=[], rank=rank, world_size=world_size, rng=False)
    if joining:
        state.make_user_state(payload, source=source)
    elif state.extra:
        restore_user_state(state.extra, payload.extra_state, source=source)


def _broadcast(blob: bytes, source: int, device: torch.device) -> tuple[bytes, int]:
    size = torch.tensor([len(blob)], dtype=torch.int64, device=device)
    torch_dist.broadcast(size, src=source)
    data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if blob:
        data.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    torch_dist.broadcast(data, src=source)
    return data.cpu().numpy().tobytes(), int(size.item())


def _reduce(value: int, op: torch_dist.ReduceOp.RedOpType, device: torch.device) -> int:
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    torch_dist.all_reduce(tensor, op=op)
    return int(tensor.item())


def _wire_device() -> torch.device:
    # NCCL moves only device tensors; gloo these CPU ones.
    if torch_dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
