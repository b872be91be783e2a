import torch


class Model:
    pass


def get_inputs():
    return [torch.randn(2)]
