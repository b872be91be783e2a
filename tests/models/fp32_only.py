"""A model that cannot take another dtype: it builds a float32 tensor and mixes it into a matmul."""

import torch


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) @ torch.ones(8, 8, dtype=torch.float32)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
