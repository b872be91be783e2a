# Example: out[0] = relu(in[0]) for a contiguous float tensor of any shape.
import helion
import helion.language as hl
import torch


@helion.kernel(config=helion.Config(block_sizes=[1024], num_warps=4, num_stages=1), static_shapes=True)
def relu_kernel(x: torch.Tensor, y: torch.Tensor) -> None:
    for tile in hl.tile(x.numel()):  # Helion masks the tail: the size need not divide
        y[tile] = torch.relu(x[tile])


def launch(inputs, outputs):
    relu_kernel(inputs[0].view(-1), outputs[0].view(-1))
