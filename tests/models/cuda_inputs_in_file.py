"""A model file written for a GPU: get_inputs puts its tensors on "cuda" explicitly."""

import torch


class Model(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.randn(2, 4, 32, 16, device="cuda") for _ in range(3)]


def get_init_inputs():
    return []
