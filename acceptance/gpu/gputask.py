"""Models, data and steps for the GPU proof: ResNet-50 on synthetic images, a GPT-2-small LM.

trainbox loads them as factories (`model.factory=gputask:resnet50`, `train.step=gputask:lm_step`,
with this folder, acceptance/gpu/, on PYTHONPATH); raw_gpu.py here imports the same functions, so
both sides train the same network on the same samples. `--cpu-dry-run` shrinks them (`tiny=True`).
"""

from __future__ import annotations

import atexit
import json
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainbox.train.data.contract import Datasets

# Where each rank writes its GPU memory peak at exit (`PATH.RANK`), if set: both sides report it
# the same way, from the process that trained.
MEMORY_OUT = "GPUTASK_MEMORY_OUT"
# ResNet-50's input side and classes; the LM's vocabulary, context, width, depth and heads (GPT-2
# small: about 124M parameters with the tied output layer).
IMAGE_SIDE, IMAGE_CLASSES = 224, 1000
VOCAB, CONTEXT, WIDTH, DEPTH, HEADS = 50257, 1024, 768, 12, 12


def _record_memory_peak() -> None:
    """Write this rank's torch.cuda.max_memory_allocated to $GPUTASK_MEMORY_OUT.RANK at exit."""
    path = os.environ.get(MEMORY_OUT)
    if not path or not torch.cuda.is_available():
        return
    rank = os.environ.get("RANK", "0")

    def write() -> None:
        peak = torch.cuda.max_memory_allocated()
        with open(f"{path}.{rank}", "w") as handle:
            json.dump({"max_memory_allocated": peak}, handle)

    atexit.register(write)


class ImagesToFloat(nn.Module):
    """uint8 NCHW images to normalised floats in channels_last, on the model's device.

    Loaders hand over bytes (a quarter of the float size to collate, pin and copy); the GPU
    converts them, as DALI-style pipelines do.
    """

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        images = images.contiguous(memory_format=torch.channels_last)
        return images.float().div_(127.5).sub_(1.0)


class Bottleneck(nn.Module):
    """ResNet's 1x1-3x3-1x1 block with a projected shortcut where the shape changes."""

    def __init__(self, inputs: int, width: int, stride: int):
        super().__init__()
        outputs = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, outputs, 1, bias=False), nn.BatchNorm2d(outputs),
        )  # fmt: skip
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def resnet50(*, tiny: bool = False) -> nn.Module:
    """ResNet-50 (25.6M parameters, torchvision's layout) in channels_last, behind the uint8
    conversion; `tiny` keeps one block per stage and 10 classes, for a CPU dry run."""
    _record_memory_peak()
    depths, classes = ((1, 1, 1, 1), 10) if tiny else ((3, 4, 6, 3), IMAGE_CLASSES)
    layers: list[nn.Module] = [
        ImagesToFloat(),
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]  # fmt: skip
    inputs = 64
    for stage, depth in enumerate(depths):
        width = 64 << stage
        for index in range(depth):
            layers.append(Bottleneck(inputs, width, 2 if index == 0 and stage > 0 else 1))
            inputs = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes)]
    return nn.Sequential(*layers).to(memory_format=torch.channels_last)


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """`count` seeded random uint8 images, cycled to `length` samples, with random labels."""

    def __init__(self, *, count: int, length: int, side: int, classes: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (count, 3, side, side), dtype=torch.uint8,
                                    generator=generator)  # fmt: skip
        self.labels = torch.randint(0, classes, (length,), generator=generator).tolist()
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index % len(self.images)], self.labels[index]


def images(*, length: int = 1 << 20, tiny: bool = False, workers: int = 4) -> Datasets:
    """Synthetic 224x224 ImageNet-shaped samples; no validation set (throughput only)."""
    side, classes = (32, 10) if tiny else (IMAGE_SIDE, IMAGE_CLASSES)
    train = SyntheticImages(count=256, length=length, side=side, classes=classes)
    # Tiny runs are CPU dry runs on small machines: one worker still takes the worker path.
    return Datasets(train=train, val=None, max_workers=1 if tiny else workers)


class GPT(nn.Module):
    """A GPT-2-small-shaped causal LM: token and position embeddings, pre-norm blocks, tied head."""

    def __init__(self, *, vocab: int, context: int, width: int, depth: int, heads: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True,
            norm_first=True,
        )  # fmt: skip
        self.blocks = nn.TransformerEncoder(block, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        # GPT-2's initial scale: with unit-variance embeddings the tied head's logits explode.
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.01)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        where = torch.arange(length, device=tokens.device)
        hidden = self.tokens(tokens) + self.positions(where)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        hidden = self.blocks(hidden, mask=mask, is_causal=True)
        return self.head(self.norm(hidden))


def gpt2(*, tiny: bool = False) -> nn.Module:
    """GPT-2 small's shape (about 124M parameters); `tiny` is a 2-layer, 64-wide one."""
    _record_memory_peak()
    if tiny:
        return GPT(vocab=512, context=64, width=64, depth=2, heads=4)
    return GPT(vocab=VOCAB, context=CONTEXT, width=WIDTH, depth=DEPTH, heads=HEADS)


class RandomTokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Seeded random token windows: inputs and the same window shifted by one as targets."""

    def __init__(self, *, length: int, context: int, vocab: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.windows = torch.randint(0, vocab, (256, context + 1), generator=generator)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.windows[index % len(self.windows)]
        return window[:-1], window[1:]


def tokens(*, length: int = 1 << 20, tiny: bool = False) -> Datasets:
    """Windows of GPT-2's context over its vocabulary; in memory, so no loader workers."""
    vocab, context = (512, 64) if tiny else (VOCAB, CONTEXT)
    train = RandomTokens(length=length, context=context, vocab=vocab)
    return Datasets(train=train, val=None, max_workers=0)


def lm_step(model: nn.Module, batch: Any) -> torch.Tensor:
    """Next-token cross entropy over every position of every window."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def spirals_dropout(*, hidden: int = 256, layers: int = 3, dropout: float = 0.1) -> nn.Module:
    """The built-in spirals MLP with dropout, so that resuming needs the CUDA RNG state."""
    from trainbox.tasks.mlp import mlp

    return mlp(in_features=2, out_features=5, hidden=hidden, layers=layers, dropout=dropout)
