"""Block-wise capture (forge.capture.blocks): the tasks of one capture per distinct block, plus the glue, are
the tasks of the whole graph cut at the same block boundaries (keys and counts), at a fraction of its nodes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from forge.capture import zoo
from forge.capture.blocks import block_list, block_scope, blockwise
from forge.capture.export import capture
from forge.capture.model_input import LoadedModel
from forge.capture.profile import profile_blockwise
from forge.tasks.cut import build_tasks


class Layer(nn.Module):
    """A pre-norm residual block whose attention-like step reads a mask the glue computes."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        h = torch.softmax(self.norm(x) * scale + mask, dim=-1)
        return x + self.down(torch.nn.functional.gelu(self.up(h)))


class Stack(nn.Module):
    """Embedding glue, three blocks of one kind and one of another (a wider hidden layer), a final norm."""

    def __init__(self, width: int = 24) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.layers = nn.ModuleList([Layer(width, 48), Layer(width, 48), Layer(width, 64), Layer(width, 48)])
        self.out = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.triu(torch.full((x.shape[-2], x.shape[-1]), -1e4, device=x.device), 1)[: x.shape[-2]]
        h = torch.relu(self.inp(x))
        for layer in self.layers:
            h = layer(h, mask=mask, scale=0.5)
        return self.out(h) * 2.0


def counts(tasks) -> dict[str, int]:
    return {t.key: t.count for t in tasks}


def assert_same_as_whole(model: nn.Module, inputs: list[torch.Tensor]) -> None:
    bw = blockwise(model, inputs)
    assert bw is not None
    paths = [p for p, _ in block_list(model)]
    whole = capture(model, inputs)
    expected = counts(build_tasks(whole.graph_module.graph, scope=block_scope(paths)))
    assert counts(bw.tasks) == expected
    assert sum(bw.blocks.values()) == len(paths)
    whole_nodes = sum(1 for n in whole.graph_module.graph.nodes if n.op == "call_function")
    if len(bw.blocks) < len(paths):
        assert bw.nodes < whole_nodes  # each distinct block captured once


def test_distinct_blocks_are_captured_once_and_give_the_whole_graphs_tasks():
    model, x = Stack().eval(), torch.randn(2, 16, 24)
    bw = blockwise(model, [x])
    assert bw is not None
    assert bw.blocks == {"layers.0": 3, "layers.2": 1}  # the wider block is a block of its own
    assert_same_as_whole(model, [x])
    # the mask only the blocks read is glue work: its task is counted once, not lost with the blocks
    (mask,) = [t for t in bw.tasks if "aten.full.default" in t.ops]
    assert mask.count == 1 and "aten.where.self" in mask.ops
    assert not any("passed_block" in op for t in bw.tasks for op in t.ops)


def test_the_whole_graph_cut_at_block_boundaries_differs_from_the_fused_cut():
    """Without the scope, the residual add of one block and the next block's norm are one region: the
    block-wise cut cannot make that region, so it is compared with the scoped whole-graph cut."""
    model, x = Stack().eval(), torch.randn(2, 16, 24)
    graph = capture(model, [x]).graph_module.graph
    scoped = build_tasks(graph, scope=block_scope([p for p, _ in block_list(model)]))
    fused = build_tasks(graph)
    assert counts(scoped) != counts(fused)
    assert len([t for t in scoped if t.family != "heavy"]) >= len([t for t in fused if t.family != "heavy"])


def test_a_model_whose_blocks_change_the_shape_is_captured_whole():
    class Widening(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 8)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    assert blockwise(Widening(), [torch.randn(4, 8)]) is None
    assert blockwise(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), [torch.randn(4, 8)]) is None  # no ModuleList


def test_a_meta_profile_of_a_block_stack_says_it_was_captured_block_wise():
    model = Stack().to("meta").eval()
    loaded = LoadedModel("stack", model, [torch.empty(2, 16, 24, device="meta")], "meta", "fp32")
    prof = profile_blockwise(loaded)
    assert prof is not None and prof.extra["blocks"] == {"layers.0": 3, "layers.2": 1}
    assert prof.total_ms is None and prof.tasks
    assert prof.to_json()["blocks"] == {"layers.0": 3, "layers.2": 1}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "opts"), [
    ("qwen35", {"layers": 4, "seq": 16}),  # layers 0-2 Gated DeltaNet, 3 full attention: two distinct blocks
    ("gemma4", {"layers": 2, "seq": 16}),
    ("sd35-mmdit", {"layers": 2, "resolution": 64, "seq": 8}),
])
def test_reference_models_give_the_same_tasks_block_wise(name, opts):
    model, inputs = zoo.build(name, device="meta", batch=1, **opts)
    assert_same_as_whole(model, inputs)
