"""A UNet/VAE-style residual conv block: GroupNorm -> SiLU -> Conv, twice, plus a skip connection."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, channels: int = 64, groups: int = 32) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels, eps=1e-6)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels, eps=1e-6)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(nn.functional.silu(self.norm1(x)))
        h = self.conv2(nn.functional.silu(self.norm2(h)))
        return x + h


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 64, 64, 64)]


def get_init_inputs() -> list:
    return [64, 32]
