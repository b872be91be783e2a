"""Models and kernels for the block-wise tests: towers of repeated blocks, called in the ways a model calls them,
and the recipe policy's first candidate for each task of their block-wise capture."""

import torch

from forge.capture.blocks import blockwise
from forge.evaluate.build import build
from forge.kernel import KernelArtifact, TaskSpec
from forge.policy.recipes.policy import RecipePolicy


class Block(torch.nn.Module):
    def __init__(self, d: int, layer_idx: int) -> None:
        super().__init__()
        self.up, self.down, self.layer_idx = torch.nn.Linear(d, 2 * d), torch.nn.Linear(d, d), layer_idx

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        g, u = self.up(x).chunk(2, -1)
        return x + self.down(torch.nn.functional.silu(g) * u) * scale


class Tower(torch.nn.Module):
    def __init__(self, d: int = 96, n: int = 3) -> None:
        super().__init__()
        self.inp, self.norm = torch.nn.Linear(d, d), torch.nn.LayerNorm(d)
        self.layers = torch.nn.ModuleList(Block(d, i) for i in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h, scale=0.5)
        return self.norm(h)


def block_keys(model: torch.nn.Module, inputs: list[torch.Tensor], arts: list[KernelArtifact]) -> set[str]:
    """The kernels' keys that are block work (an occurrence in a block, not only in the glue)."""
    bw = blockwise(model, inputs)
    assert bw is not None
    inside = {t.key for t in bw.tasks if any(not occ[0].startswith("glue:") for occ in t.occurrences)}
    return {a.key for a in arts} & inside


def recipe_kernels(model: torch.nn.Module, inputs: list[torch.Tensor], blocks: dict[str, int] | None = None,
             limit: int = 100) -> list[KernelArtifact]:
    """The recipe policy's first candidate for every task of the block-wise capture (the first `limit` it
    proposes for), built with the real compiler."""
    bw = blockwise(model, inputs)
    assert bw is not None and bw.blocks == (blocks or {"layers.0": len(model.layers)})
    pol, arts = RecipePolicy(inputs[0].device.type), []  # CUDA kernels for a model on the GPU
    for t in bw.tasks:
        if len(arts) >= limit:
            break
        spec = TaskSpec.of(t)
        proposals = pol.propose(spec, None)
        if not proposals:
            continue
        c = pol.render(spec, proposals[0])
        b = build(c)
        assert b.ok, b.log
        arts.append(KernelArtifact(t.key, c.backend, b.path, c.entry, t.inputs, t.outputs, t.source))
    return arts


class PositionalTower(Tower):
    """Tower whose blocks are called with one tensor, positionally: `_BlockForward`'s lookup by layout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class MaskedBlock(Block):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = super().forward(x)
        return y if mask is None else y * mask


class Twice(Tower):
    """Each block called twice a forward: without a mask, then with one."""

    def __init__(self) -> None:
        super().__init__(n=3)
        self.layers = torch.nn.ModuleList(MaskedBlock(96, i) for i in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, mask = self.inp(x), (x[..., :1] > 0).to(x.dtype)
        for layer in self.layers:
            h = layer(layer(h), mask)
        return self.norm(h)
