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


def counts(tasks: list | tuple) -> dict[str, int]:
    return {t.key: t.count for t in tasks}


def assert_same_as_whole(model: nn.Module, inputs: list[torch.Tensor]) -> None:
    bw = blockwise(model, inputs)
    assert bw is not None
    paths = [p for p, _ in block_list(model)]
    whole = capture(model, inputs)
    expected = counts(build_tasks(whole.graph_module.graph, scope=block_scope(paths)))
    assert counts(bw.tasks) == expected
    assert sum(bw.blocks.values()) % len(paths) == 0  # every block called, as often as the others here
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


class Act(nn.Module):
    """A block whose activation is chosen at construction: same parameters, different work."""

    def __init__(self, act: nn.Module, scaled: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.act = act
        self.scaled = scaled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.lin(x))
        return x + (y * 3.0 if self.scaled else y)


class Acts(nn.Module):
    def __init__(self, layers: list[nn.Module], calls: int = 1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.calls = calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.calls):
            for layer in self.layers:
                x = layer(x).view(2, 8, 16).reshape(16, 16)  # views between blocks: glue work
        return x


@pytest.mark.parametrize("layers", [
    [Act(nn.GELU()), Act(nn.SiLU()), Act(nn.SiLU())],  # submodule classes
    [Act(nn.GELU()), Act(nn.GELU(approximate="tanh")), Act(nn.GELU())],  # a submodule's setting
    [Act(nn.ReLU()), Act(nn.ReLU(), scaled=True), Act(nn.ReLU())],  # a plain attribute the forward reads
])
def test_blocks_that_do_different_work_are_not_one_block(layers):
    model, x = Acts(layers).eval(), torch.randn(16, 16)
    bw = blockwise(model, [x])
    assert bw is not None and len(bw.blocks) == 2
    assert_same_as_whole(model, [x])


def test_a_block_called_several_times_counts_every_call_and_views_between_blocks_stay():
    model, x = Acts([Act(nn.ReLU()), Act(nn.ReLU())], calls=3).eval(), torch.randn(16, 16)
    bw = blockwise(model, [x])
    assert bw is not None and bw.blocks == {"layers.0": 6}
    assert_same_as_whole(model, [x])


class Swap(nn.Module):
    """Two streams of one shape, returned the other way round: either wiring would fit."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, h: torch.Tensor, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ctx + self.a(h), h + self.b(ctx)


class Cached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, cache: object) -> torch.Tensor:
        return x + self.lin(x)


class Outer(nn.Module):
    def __init__(self, kind: type[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList([kind(), kind()])
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind is Swap:
            h, c = x, x * 2
            for layer in self.layers:
                h, c = layer(h, c)
            return torch.sigmoid(h) * 3 + c
        state = object()
        for layer in self.layers:
            x = layer(x, state)
        return x


@pytest.mark.parametrize("kind", [Swap, Cached])
def test_an_ambiguous_wiring_or_shared_state_is_captured_whole(kind):
    model = Outer(kind).eval()
    assert blockwise(model, [torch.randn(4, 8)]) is None
    assert "forward" not in vars(model.layers[0])  # the pass-through is taken off again


def test_a_forward_set_on_a_block_instance_is_put_back():
    model = Acts([Act(nn.ReLU()), Act(nn.ReLU())]).eval()
    wrapped = model.layers[1].forward
    model.layers[1].forward = wrapped  # an instance attribute, as a wrapper would set
    assert blockwise(model, [torch.randn(16, 16)]) is not None
    assert vars(model.layers[1])["forward"] is wrapped and "forward" not in vars(model.layers[0])


def test_a_timed_block_wise_profile_counts_each_kinds_time_once_per_block():
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.randn(2, 16, 24)
    loaded = LoadedModel("stack", model, [x], "cpu", "fp32")
    prof = profile_blockwise(loaded, budget_s=0.2)
    assert prof is not None and prof.extra["blocks"] == {"layers.0": 3, "layers.2": 1}
    assert prof.total_ms and all(t.ms and t.ms > 0 for t in prof.tasks)
    assert abs(sum(t.share for t in prof.tasks) - 1.0) < 1e-9
    whole = capture(model, [x]).graph_module.graph
    assert counts(prof.tasks) == counts(build_tasks(whole, scope=block_scope([p for p, _ in block_list(model)])))


def test_the_cli_profiles_block_wise(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path
    out = tmp_path / "p.json"
    cmd = [str(Path(sys.executable).parent / "forge"), "profile", "--zoo", "qwen35", "--layers", "4", "--seq", "16",
           "--device", "cpu", "--blocks", "--budget", "0.2", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    prof = json.loads(out.read_text())
    assert prof["blocks"] == {"lm.model.layers.0": 3, "lm.model.layers.3": 1} and prof["total_ms"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("name", "opts"), [
    ("qwen35", {"layers": 4, "seq": 16}),  # layers 0-2 Gated DeltaNet, 3 full attention: two distinct blocks
    ("sd35-mmdit", {"layers": 3, "resolution": 64, "seq": 8}),  # two dual-attention blocks and the last
])
def test_reference_models_give_the_same_tasks_block_wise(name, opts):
    model, inputs = zoo.build(name, device="meta", batch=1, **opts)
    assert_same_as_whole(model, inputs)


@pytest.mark.slow
def test_gemma4_layers_share_state_so_it_is_captured_whole():
    """Gemma 4's layers hand K/V to later layers through a dict every layer is called with: what one block
    does is not all of its work, so block-wise capture refuses it."""
    model, inputs = zoo.build("gemma4", device="meta", batch=1, layers=2, seq=16)
    assert blockwise(model, inputs) is None


def test_qwen35_is_profiled_block_wise_by_default_and_whole_on_request():
    from forge.cli import _blocks, build_parser

    def parsed(*extra: str) -> bool:
        return _blocks(build_parser().parse_args(["profile", "--zoo", "qwen35", "--device", "meta", *extra]))

    assert parsed() is True and parsed("--no-blocks") is False
    assert _blocks(build_parser().parse_args(["optimize", "--zoo", "gemma4"])) is False
    assert _blocks(build_parser().parse_args(["optimize", "x.py", "--blocks"])) is True
