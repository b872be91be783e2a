"""Block-wise dispatch (forge.runtime.blockwise): kernels found block-wise run inside every block of a kind."""

import pytest
import torch
from blockwise_towers import PositionalTower, Tower, Twice, block_keys, recipe_kernels

from forge.capture.blocks import blockwise
from forge.runtime.blockwise import apply_blockwise


def test_block_kernels_run_in_every_block_and_the_model_stays_the_users():
    torch.manual_seed(0)
    model, x = Tower().eval(), torch.randn(5, 33, 96)  # odd sizes: tails in every kernel
    arts = recipe_kernels(model, [x])
    keys_before = list(model.state_dict())
    fired: list[int] = []
    model.layers[1].register_forward_hook(lambda m, a, out: fired.append(1))
    opt = apply_blockwise(model, [x], arts)
    assert opt is not None
    for _ in range(2):
        y = torch.randn(5, 33, 96)
        with torch.no_grad():
            expected = model(y)
        torch.testing.assert_close(opt(y), expected)
    calls_hooked = len(fired)
    assert set(opt.counters()) == block_keys(model, [x], arts) != set()
    # 2 calls x 3 blocks of one kind: every block ran its kind's kernels
    assert all(c.hits == 6 and not c.fallbacks for c in opt.counters().values())
    assert opt.block_fallbacks == 0 and opt.model_fallbacks == 0
    assert list(model.state_dict()) == keys_before and "forward" not in vars(model.layers[0])
    assert calls_hooked == 1 + 2 * 2  # the hook fired in the recording forward, then in eager and patched calls


def test_a_block_with_other_weights_gets_its_own_and_an_unlike_call_falls_back():
    torch.manual_seed(1)
    model, x = Tower(n=2).eval(), torch.randn(4, 96)
    with torch.no_grad():
        model.layers[1].down.weight.mul_(3.0)  # the same kind, other values: each block its own state
    arts = recipe_kernels(model, [x])
    opt = apply_blockwise(model, [x], arts)
    assert opt is not None and set(opt.counters()) == block_keys(model, [x], arts) != set()
    y = torch.randn(4, 96)
    with torch.no_grad():
        torch.testing.assert_close(opt(y), model(y))
        h = model.inp(y)
        out = opt._forwards[id(model.layers[0])][1](h, scale=0.25)  # another constant than recorded
        torch.testing.assert_close(out, model.layers[0](h, scale=0.25))
    assert opt.block_fallbacks == 1
    assert all(c.hits == 2 for c in opt.counters().values())  # the patched call ran both blocks' kernels


def test_a_positional_call_is_looked_up_by_its_tensors_layouts_as_the_long_way_matches_it():
    torch.manual_seed(2)
    model, x = PositionalTower(n=2).eval(), torch.randn(6, 96)
    arts = recipe_kernels(model, [x])
    opt = apply_blockwise(model, [x], arts)
    assert opt is not None and opt.counters()
    fwd = opt._forwards[id(model.layers[0])][1]
    (recorded,) = fwd.calls
    h = torch.randn(6, 96)
    like = [h, torch.randn(6, 96), torch.randn(6, 96, requires_grad=True), torch.nn.Parameter(torch.randn(6, 96))]
    unlike = [h.t().contiguous().t(), torch.randn(7, 96), torch.randn(6, 192)[:, ::2], h.double(), h.bfloat16(),
              torch.empty(6, 96, device="meta"), torch.randn(()), torch.randn(6, 96)[None]]
    calls = [((a,), {}, recorded) for a in like] + [((a,), {}, None) for a in unlike]
    calls += [((), {}, None), ((h, h), {}, None), ((h,), {"scale": 1.0}, None), ((), {"x": h}, None)]
    for args, kwargs, expected in calls:  # the last two: kwargs, the long way
        leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        assert fwd.find(args, kwargs)[0] is fwd.match(leaves, spec) is expected
    with torch.no_grad():
        for i, a in enumerate([h, h.t().contiguous().t(), torch.randn(7, 96), h, torch.randn(6, 96)]):
            torch.testing.assert_close(fwd(a), model.layers[0](a))
            assert fwd.fallbacks == [0, 1, 2, 2, 2][i], i  # each unlike call counted, as often as made
    assert all(c.hits == 3 and not c.fallbacks for c in opt.counters().values())  # the three like calls


def test_a_block_traced_with_symbolic_sizes_takes_the_long_way():
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    model, x = PositionalTower(n=2).eval(), torch.randn(6, 96)
    opt = apply_blockwise(model, [x], [])
    assert opt is not None
    fwd = opt._forwards[id(model.layers[0])][1]
    with torch.no_grad():  # the sizes are SymInts, which do not hash: matched as Specs, which pin them
        make_fx(lambda t: fwd(t), tracing_mode="symbolic", _allow_non_fake_inputs=True)(torch.randn(6, 96))
    assert fwd.fallbacks == 0


def test_a_block_called_two_ways_runs_a_patched_graph_for_each():
    torch.manual_seed(5)
    model, x = Twice().eval(), torch.randn(5, 33, 96)
    arts = recipe_kernels(model, [x])
    opt = apply_blockwise(model, [x], arts)
    assert opt is not None and len(opt._kinds) == 2
    assert all(len(f.calls) == 2 for _, f in opt._forwards.values())
    y = torch.randn(5, 33, 96)
    with torch.no_grad():
        torch.testing.assert_close(opt(y), model(y))
    assert opt.block_fallbacks == 0 and set(opt.counters()) == block_keys(model, [x], arts) != set()
    assert all(c.hits and not c.fallbacks for c in opt.counters().values())


def test_a_model_without_repeated_blocks_is_not_dispatched_block_wise():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    assert apply_blockwise(model, [torch.randn(2, 8)], []) is None


def test_two_kinds_of_block_with_a_mask_from_the_glue():
    from test_blocks import Stack

    torch.manual_seed(2)
    model, x = Stack().eval(), torch.randn(2, 16, 24)
    arts = recipe_kernels(model, [x], {"layers.0": 3, "layers.2": 1})
    opt = apply_blockwise(model, [x], arts)
    assert opt is not None and len(opt._kinds) == 2
    assert set(opt.counters()) == block_keys(model, [x], arts) != set()
    y = torch.randn(2, 16, 24)
    with torch.no_grad():
        torch.testing.assert_close(opt(y), model(y))
    hits = {c.hits for c in opt.counters().values()}
    assert opt.counters() and hits <= {1, 3} and opt.block_fallbacks == 0  # per kind: its blocks' calls


@pytest.mark.slow
def test_qwen35_runs_its_block_kernels_in_every_layer():
    from forge.capture import zoo

    torch.manual_seed(3)
    model, inputs = zoo.build("qwen35", device="cpu", batch=1, layers=4, seq=16)
    arts = recipe_kernels(model, inputs, {"lm.model.layers.0": 3, "lm.model.layers.3": 1}, limit=8)
    opt = apply_blockwise(model, inputs, arts)
    assert opt is not None and len(opt._kinds) == 2
    with torch.no_grad():
        expected = model(*inputs)
        got = opt(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert opt.counters() and all(c.hits and not c.fallbacks for c in opt.counters().values())
    assert opt.block_fallbacks == 0
    # the full-attention layer is called without a mask in eager and with one under export: its attention
    # region's key differs, so a few kernels found on the trace apply to no block (logged); the rest all do
    missing = block_keys(model, inputs, arts) - set(opt.counters())
    assert len(missing) <= 3, missing


@pytest.mark.cuda
def test_on_the_gpu_the_whole_forward_replays_as_one_cuda_graph_with_block_kernels():
    torch.manual_seed(4)
    model, x = Tower().cuda().eval(), torch.randn(5, 33, 96, device="cuda")
    arts = recipe_kernels(model, [x])
    opt = apply_blockwise(model, [x], arts, cuda_graph=True)
    assert opt is not None
    outs = []
    for _ in range(3):
        y = torch.randn_like(x)
        with torch.no_grad():
            got, want = opt(y), model(y)
        torch.testing.assert_close(got, want)
        outs.append((got, want))
    assert opt._replay is not None and opt.graph_error == ""
    assert set(opt.counters()) == block_keys(model, [x], arts) != set()
    torch.testing.assert_close(*outs[0])  # later replays did not overwrite the first call's output
    assert opt.counters() and all(c.hits >= 1 and not c.fallbacks for c in opt.counters().values())
    assert "forward" not in vars(model.layers[0])


class MaskWhileCapturing(Twice):
    """As transformers does with Qwen 3.5's causal mask: one (of ones) passed only while a stream captures."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        mask = torch.ones_like(x[..., :1]) if torch.cuda.is_current_stream_capturing() else None
        for layer in self.layers:
            h = layer(h, mask)
        return self.norm(h)


@pytest.mark.cuda
def test_blocks_called_otherwise_under_cuda_graph_capture_replay_their_kernels():
    torch.manual_seed(6)
    model, x = MaskWhileCapturing().cuda().eval(), torch.randn(5, 33, 96, device="cuda")
    arts = recipe_kernels(model, [x])
    opt = apply_blockwise(model, [x], arts, cuda_graph=True)
    assert opt is not None and all(len(f.calls) == 2 for _, f in opt._forwards.values())
    for _ in range(2):
        y = torch.randn_like(x)
        with torch.no_grad():
            torch.testing.assert_close(opt(y), model(y))
    assert opt.cuda_graph and opt.block_fallbacks == 0 and opt.model_fallbacks == 0
    assert opt.counters() and all(c.hits and not c.fallbacks for c in opt.counters().values())


class Scaled(torch.nn.Module):
    """A block with a per-block tensor attribute (not a buffer) and a shift that is a tuple attribute."""

    def __init__(self, i: int, shift: tuple[int, ...]) -> None:
        super().__init__()
        self.lin, self.scale, self.shift = torch.nn.Linear(32, 32), torch.tensor(1.0 + i), shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.roll(torch.relu(self.lin(x)) * self.scale, self.shift, dims=(0,))


class Counting(torch.nn.Module):
    """A block that changes state: it counts its calls in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x + torch.relu(self.lin(x))


class Layers(torch.nn.Module):
    def __init__(self, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_each_block_gets_its_own_tensor_attributes_and_other_settings_make_another_kind():
    torch.manual_seed(6)
    model, x = Layers([Scaled(0, (1,)), Scaled(1, (1,)), Scaled(2, (2,))]).eval(), torch.randn(8, 32)
    opt = apply_blockwise(model, [x], [])
    assert opt is not None and len(opt._kinds) == 2  # the third block rolls by another amount
    y = torch.randn(8, 32)
    with torch.no_grad():
        torch.testing.assert_close(opt(y), model(y))
    assert opt.block_fallbacks == 0


def test_a_block_that_changes_state_is_not_dispatched_block_wise():
    model, x = Layers([Counting(), Counting()]).eval(), torch.randn(4, 32)
    assert apply_blockwise(model, [x], []) is None


def test_a_timed_profile_takes_an_expanded_input():
    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return x + self.lin(x).masked_fill(mask, 0.0)

    class Stack2(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Masked(), Masked()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = (torch.arange(16) % 3 == 0).expand(x.shape[0], 8, 16)  # stride 0 over the batch
            for layer in self.layers:
                x = layer(x, mask)
            return x

    bw = blockwise(Stack2(), [torch.randn(4, 8, 16)], budget_s=0.1)
    assert bw is not None and bw.blocks == {"layers.0": 2} and all(t.ms is not None for t in bw.tasks)
