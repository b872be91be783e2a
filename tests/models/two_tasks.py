"""Two searchable regions split by a matmul (a softmax, then a SiLU and add): small, for resume tests."""

import torch


class Model(torch.nn.Module):
    def __init__(self, dim: int = 256) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(dim, dim) / dim**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x * 0.5, dim=-1)
        return torch.nn.functional.silu(y @ self.w) + 1.0


def get_inputs():
    return [torch.randn(512, 256)]


def get_init_inputs():
    return [256]
