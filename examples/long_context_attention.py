"""Long-context causal self-attention written out by hand (1024 tokens, 8 heads of 32): at this length the
1024 x 1024 attention matrix (scale, mask, softmax) costs more than the matmuls around it."""

import math

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, dim: int = 256, heads: int = 4, max_seq: int = 512) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(2, 1024, 256)]


def get_init_inputs() -> list:
    return [256, 8, 1024]
