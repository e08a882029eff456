"""The encoder, the masked autoencoder around it, and the classifier that reuses it."""

from __future__ import annotations

import torch
from torch import nn

from mae_example.clips import PATTERNS, SHAPE

TUBE = (2, 4, 4)  # frames, height, width of one token's tubelet


def token_count() -> int:
    return (SHAPE[0] // TUBE[0]) * (SHAPE[2] // TUBE[1]) * (SHAPE[3] // TUBE[2])


def patchify(clips: torch.Tensor) -> torch.Tensor:
    """B x T x C x H x W clips → B x tokens x values, one token per tubelet."""
    b, t, c, h, w = clips.shape
    (pt, ph, pw) = TUBE
    x = clips.reshape(b, t // pt, pt, c, h // ph, ph, w // pw, pw)
    return x.permute(0, 1, 4, 6, 2, 3, 5, 7).reshape(b, token_count(), pt * c * ph * pw)


class Encoder(nn.Module):
    """Tubelet embedding, positions and a small transformer: the part worth pretraining."""

    def __init__(self, width: int = 48, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        values = TUBE[0] * SHAPE[1] * TUBE[1] * TUBE[2]
        self.embed = nn.Linear(values, width)
        self.position = nn.Parameter(0.02 * torch.randn(1, token_count(), width))
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)

    def tokens(self, clips: torch.Tensor) -> torch.Tensor:
        return self.embed(patchify(clips))

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.blocks(tokens + self.position)


class MaskedAutoencoder(nn.Module):
    """Encodes the visible tubelets only, rebuilds the hidden ones, and returns its own loss."""

    def __init__(self, width: int = 48, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.encoder = Encoder(width, depth, heads)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        self.decoder_position = nn.Parameter(0.02 * torch.randn(1, token_count(), width))
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        # The decoder mixes tokens: what a hidden tubelet holds must come from the visible ones.
        self.decoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.rebuild = nn.Linear(width, self.encoder.embed.in_features)

    def forward(self, clip: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        tokens = self.encoder.tokens(clip) + self.encoder.position
        # Every clip hides the same number of tubelets, so the visible ones gather into a block.
        order = mask.to(torch.int8).argsort(dim=1, stable=True)  # visible first, then hidden
        visible = int((~mask[0]).sum())
        index = order[:, :visible, None].expand(-1, -1, tokens.shape[-1])
        encoded = self.encoder.blocks(tokens.gather(1, index))
        full = self.mask_token.to(encoded.dtype).expand(len(clip), token_count(), -1).clone()
        full = full.scatter(1, index, encoded) + self.decoder_position
        rebuilt = self.rebuild(self.decoder(full))
        # Only the hidden tubelets count: copying visible ones teaches nothing.
        error = (rebuilt - patchify(clip)).pow(2).mean(dim=-1)
        return {"loss": error[mask].mean(), "rebuilt": rebuilt}


class Classifier(Encoder):
    """The encoder's own layout (so init_prefix=encoder fits it) plus a linear head."""

    def __init__(self, width: int = 48, depth: int = 2, heads: int = 4) -> None:
        super().__init__(width, depth, heads)
        self.head = nn.Linear(width, PATTERNS)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        return self.head(self.encode(self.tokens(clips)).mean(dim=1))
