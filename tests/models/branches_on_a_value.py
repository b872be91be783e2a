"""A forward with a Python branch on a tensor's value: torch.export cannot take it as one graph."""

import torch


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(16, 16)]


def get_init_inputs() -> list:
    return []
