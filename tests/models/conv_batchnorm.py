"""A convolution, a BatchNorm and a ReLU, as KernelBench level 2 has them: run as constructed (training mode,
batch statistics, running statistics updated on every call) or in eval mode (running statistics) they are
different functions."""

import torch


class Model(torch.nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))) * 2.0


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 3, 13, 11) * 3 + 1]  # far from the initial running stats (0, 1)


def get_init_inputs() -> list[object]:
    return []
