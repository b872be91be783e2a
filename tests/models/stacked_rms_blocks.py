"""Four identical blocks: a hand-written RMSNorm (six ATen ops with its weight), x * silu(x), a projection and a
residual add. The normalization and the activation are one pass for a kernel and eight ops for eager: a win a
loaded machine's noise does not hide (2.5-2.7x that task on a 2-core CPU, where stacked_blocks.py's GELU
gains 1.3x, often judged within noise)"""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return x + self.proj(nn.functional.silu(h) * h)


class Model(nn.Module):
    def __init__(self, dim: int = 128, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def get_inputs():
    return [torch.randn(8, 128, 128)]


def get_init_inputs():
    return [128, 4]
