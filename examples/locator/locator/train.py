"""The training seams: loss, metrics, prediction columns, optimizer and schedule.

Each function is named in config.yaml (`train.step: locator.train:step`, ...). None of them
knows what calls it: the step returns a loss, the metrics return (sum, count) pairs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from locator.data import gaussian
from locator.model import STRIDE

# Heatmap cells are few and mostly zero, so their MSE is small beside the BCE: weigh it up.
HEATMAP_WEIGHT = 20.0
# Width of the target bump, in heatmap cells.
TARGET_SIGMA = 1.0
Batch = dict[str, torch.Tensor]


def cell(position: torch.Tensor) -> torch.Tensor:
    """Pixel coordinates -> heatmap cell coordinates (cell k covers pixels kS .. kS+S-1)."""
    return (position - (STRIDE - 1) / 2) / STRIDE


def pixel(cells: torch.Tensor) -> torch.Tensor:
    """Heatmap cell coordinates -> pixel coordinates."""
    return cells * STRIDE + (STRIDE - 1) / 2


def target_heatmap(batch: Batch, side: int) -> torch.Tensor:
    """A bump at each blob's cell, and all zeros for tiles without a blob."""
    bumps = [gaussian(centre, sigma=TARGET_SIGMA, size=side) for centre in cell(batch["position"])]
    stacked = torch.stack(bumps).to(batch["image"].device)
    return stacked * batch["present"].view(-1, 1, 1)


def step(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Heatmap MSE plus presence BCE; both parts are logged beside the loss."""
    out = model(batch["image"])
    heatmap = out["heatmap"].float()
    heatmap_mse = F.mse_loss(heatmap, target_heatmap(batch, heatmap.shape[-1]))
    presence_bce = F.binary_cross_entropy_with_logits(out["presence"].float(), batch["present"])
    loss = HEATMAP_WEIGHT * heatmap_mse + presence_bce
    return loss, {"heatmap_mse": heatmap_mse.detach(), "presence_bce": presence_bce.detach()}


def locate(heatmap: torch.Tensor) -> torch.Tensor:
    """[B, H, W] -> [B, 2] pixel (x, y): the peak cell, refined to a fraction of a cell."""
    width = heatmap.shape[-1]
    peak = heatmap.flatten(1).argmax(dim=1)
    rows = torch.arange(len(heatmap), device=heatmap.device)
    py, px = peak // width, peak % width
    # A Gaussian bump is a parabola in log space: its vertex is the exact centre.
    logs = heatmap.clamp(min=1e-4).log()
    x = px + vertex(logs[rows, py], px)
    y = py + vertex(logs.transpose(1, 2)[rows, px], py)
    return pixel(torch.stack([x, y], dim=1))


def vertex(line: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """The vertex of the parabola through line[at - 1], line[at], line[at + 1], as an offset."""
    rows = torch.arange(len(line), device=line.device)
    inside = (at > 0) & (at < line.shape[1] - 1)
    left = line[rows, (at - 1).clamp(min=0)]
    centre = line[rows, at]
    right = line[rows, (at + 1).clamp(max=line.shape[1] - 1)]
    curve = left - 2 * centre + right
    # At the border, or on a flat top, there is no parabola to fit: stay on the peak cell.
    fits = inside & (curve < -1e-6)
    offset = (left - right) / (2 * torch.where(fits, curve, -torch.ones_like(curve)))
    return torch.where(fits, offset.clamp(-0.5, 0.5), torch.zeros_like(offset))


def eval_step(model: nn.Module, batch: Batch) -> dict[str, tuple[Any, Any]]:
    """Presence accuracy over all tiles; localisation error in pixels over tiles with a blob."""
    out = model(batch["image"])
    present = batch["present"] > 0.5
    correct = ((out["presence"].float() > 0) == present).sum()
    error = (locate(out["heatmap"].float()) - batch["position"]).norm(dim=1)
    # Only tiles that hold a blob have a position to miss: they alone are counted.
    return {
        "presence_accuracy": (correct, len(present)),
        "localisation_error_px": (error[present].double().sum(), present.sum()),
    }


def predict_step(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    """Per tile: the probability that it holds a blob, and where the blob would be."""
    out = model(batch["image"])
    where = locate(out["heatmap"].float())
    return {"presence": torch.sigmoid(out["presence"].float()), "x": where[:, 0], "y": where[:, 1]}


def optimizer(model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW that decays conv and linear weights, but not biases or norm scales and shifts."""
    decay, no_decay = [], []
    for module in model.modules():
        norm = isinstance(module, nn.GroupNorm | nn.BatchNorm2d | nn.LayerNorm)
        for name, param in module.named_parameters(recurse=False):
            (no_decay if norm or name == "bias" else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr)


def schedule(
    optimizer: torch.optim.Optimizer, max_steps: int, *, peak_lr: float, warmup: float = 0.3
) -> torch.optim.lr_scheduler.LRScheduler:
    """One cycle: up to peak_lr over the first `warmup` share of the steps, then down to ~0."""
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=peak_lr, total_steps=max_steps, pct_start=warmup
    )
