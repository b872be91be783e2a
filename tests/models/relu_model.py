"""One ReLU: the smallest task there is, for evaluation tests."""

import torch


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(300, 1000)]


def get_init_inputs():
    return []
