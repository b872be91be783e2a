"""A convolutional block in the SD3.5 VAE's pattern: convolution, GroupNorm + SiLU, a GroupNorm over a
transposed (b, c, h*w) view as an attention block takes it, a residual add, a convolution."""

import torch


class Model(torch.nn.Module):
    def __init__(self, channels: int = 32, groups: int = 8) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = torch.nn.GroupNorm(groups, channels)
        self.attn_norm = torch.nn.GroupNorm(groups, channels)
        self.out = torch.nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.norm(self.conv(x)))
        b, c, height, width = h.shape
        tokens = h.view(b, c, height * width).transpose(1, 2)  # (b, h*w, c), as attention reads it
        a = self.attn_norm(tokens.transpose(1, 2)).transpose(1, 2)
        a = a.transpose(1, 2).reshape(b, c, height, width)
        return self.out(a + h) + x


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(2, 32, 17, 19)]  # odd sizes: no vector width divides a row


def get_init_inputs() -> list[object]:
    return []
