"""fa4-attention: which attention calls it takes, how it wires them, and (CUDA, FlashAttention 4 installed) that
the rewritten graph matches SDPA on the GPU, also replayed as a CUDA graph and compiled.

On the CPU FlashAttention 4 cannot run: the wiring tests put a stand-in behind forge::fa4_attention that holds
FlashAttention's contract ((batch, tokens, heads, width) inputs with a contiguous last dimension, the result in
that layout) and computes with SDPA; the real library runs in the CUDA test."""

import logging
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import forge.runtime.rewrite_fa4 as rf
import forge.runtime.rewrite_masks as rm
from forge.runtime.dispatch import apply
from forge.runtime.rewrite_base import Graph
from forge.runtime.rewrites import REWRITES

aten = torch.ops.aten
F = torch.nn.functional
FA4 = torch.ops.forge.fa4_attention.default


class Heads(nn.Module):
    """Attention as diffusers and transformers write it: heads split off (batch, tokens, width) and transposed,
    attention, then the heads merged back."""

    def __init__(self, heads: int, kv_heads: int | None = None, **kw) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.kw = heads, kv_heads or heads, kw

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, n, _ = q.shape

        def split(t: torch.Tensor, h: int) -> torch.Tensor:
            return t.view(b, t.shape[1], h, -1).transpose(1, 2)

        o = F.scaled_dot_product_attention(split(q, self.heads), split(k, self.kv_heads), split(v, self.kv_heads),
                                           **self.kw)
        return o.transpose(1, 2).reshape(b, n, -1) + 1


class Joint(nn.Module):
    """MMDiT's joint attention: image and text tokens concatenated along the tokens (contiguous heads-first)."""

    def forward(self, q, k, v, cq, ck, cv):
        o = F.scaled_dot_product_attention(*(torch.cat([a, c], 2) for a, c in ((q, cq), (k, ck), (v, cv))))
        return o.transpose(1, 2).flatten(2)


def _tokens(b, n, width, dtype=torch.bfloat16, device="cpu"):
    return torch.randn(b, n, width, dtype=dtype, device=device)


def _rewritten(model, inputs):
    opt = apply(model, inputs, [])
    sites = rf.Fa4Attention().apply(Graph(opt.gm, opt._template, opt._user_slots))
    opt.gm.graph.eliminate_dead_code()
    opt.gm.recompile()
    return opt, sites, [n.target for n in opt.gm.graph.nodes if n.op == "call_function"]


@pytest.fixture
def stand_in(monkeypatch):
    """FlashAttention 4's flash_attn_func by SDPA, holding FlashAttention's contract: its layout, dtypes, head
    widths and head groups, and its causal mask and window (aligned bottom-right: where queries and keys are
    not as many, SDPA's top-left causal mask differs, and a rewrite that let such a call through would not
    match)."""
    seen = []

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None)):
        assert all(t.dim() == 4 and t.stride(-1) == 1 for t in (q, k, v))
        assert q.dtype in (torch.float16, torch.bfloat16) and q.dtype == k.dtype == v.dtype
        assert rf.width_fits(q.shape[-1]) and k.shape[-1] == q.shape[-1] and v.shape[-1] == q.shape[-1]
        assert q.shape[0] == k.shape[0] == v.shape[0] and k.shape[1:3] == v.shape[1:3] and q.shape[2] % k.shape[2] == 0
        assert window_size == (None, None) or (causal and window_size[0] >= 0 and window_size[1] == 0)
        seen.append((q.shape, k.shape, softmax_scale, causal, q.is_contiguous(), window_size))
        n_q, n_k = q.shape[1], k.shape[1]
        mask = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q) if causal else None
        if window_size[0] is not None:  # and only the window_size[0] keys before each query's own
            mask &= torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q - window_size[0])
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                           scale=softmax_scale, enable_gqa=q.shape[2] != k.shape[2])
        return o.transpose(1, 2).contiguous(), None

    monkeypatch.setattr(rf, "fa4", lambda: SimpleNamespace(flash_attn_func=flash_attn_func))
    return seen


@pytest.mark.parametrize("case", ["plain", "scaled", "causal", "gqa", "width128"])
def test_fa4_attention_wires_attention_as_sdpa_computes_it(stand_in, case):
    torch.manual_seed(0)
    model, inputs = {
        "plain": (Heads(3), [_tokens(2, 37, 3 * 64) for _ in range(3)]),
        "scaled": (Heads(2, scale=0.3), [_tokens(1, 19, 128), _tokens(1, 23, 128), _tokens(1, 23, 128)]),
        "causal": (Heads(2, is_causal=True), [_tokens(2, 21, 64) for _ in range(3)]),
        "gqa": (Heads(4, 2, enable_gqa=True), [_tokens(1, 17, 4 * 32), _tokens(1, 17, 64), _tokens(1, 17, 64)]),
        "width128": (Heads(1), [_tokens(1, 9, 128) for _ in range(3)]),
    }[case]
    opt, sites, targets = _rewritten(model, inputs)
    assert sites == 1 and FA4 in targets and aten.scaled_dot_product_attention.default not in targets
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), model(*inputs), rtol=2e-2, atol=2e-2)
    (q_shape, k_shape, scale, causal, _, window_size), = stand_in[-1:]
    width = q_shape[-1]
    assert scale == pytest.approx(0.3 if case == "scaled" else 1 / math.sqrt(width)) and causal == (case == "causal")
    assert window_size == (None, None)
    assert q_shape[1] == inputs[0].shape[1]  # tokens second: FlashAttention's layout


def test_fa4_attention_hands_joint_attention_over_without_a_copy(stand_in):
    q, k, v, cq, ck, cv = (torch.randn(2, 3, n, 64, dtype=torch.bfloat16) for n in (16, 16, 16, 5, 5, 5))
    model = Joint()
    eager_graph = apply(model, [q, k, v, cq, ck, cv], []).gm.graph
    assert aten.clone.default in [n.target for n in eager_graph.nodes]  # the heads merged by a copy
    opt, sites, targets = _rewritten(model, [q, k, v, cq, ck, cv])
    assert sites == 1 and aten.clone.default not in targets  # the op's result is in the merged layout already
    with torch.no_grad():
        out = opt(q, k, v, cq, ck, cv)
        torch.testing.assert_close(out, model(q, k, v, cq, ck, cv), rtol=2e-2, atol=2e-2)
    assert out.is_contiguous()
    assert stand_in[-1][0] == (2, 21, 3, 64) and not stand_in[-1][4]  # a transposed view, not a copy


def test_attention_that_is_a_graph_output_comes_back_row_major(stand_in):
    inputs = [torch.randn(1, 2, 9, 64, dtype=torch.bfloat16) for _ in range(3)]
    opt, sites, _ = _rewritten(Sdpa(), inputs)
    with torch.no_grad():
        out = opt(*inputs)
        want = Sdpa()(*inputs)
    assert sites == 1 and out.stride() == want.stride()  # user code may view it as eager's
    torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)


class Sdpa(nn.Module):
    def __init__(self, **kw) -> None:
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **self.kw)


@pytest.mark.parametrize("case, width, dtype, n_kv, kw", [
    ("float32", 64, torch.float32, 9, {}),
    ("wide", 160, torch.bfloat16, 9, {}),
    ("odd_width", 60, torch.bfloat16, 9, {}),
    ("causal_rect", 64, torch.bfloat16, 11, {"is_causal": True}),  # top-left and bottom-right triangles differ
    ("mask", 64, torch.bfloat16, 9, {"attn_mask": torch.ones(9, 9, dtype=torch.bool)}),
    ("dropout", 64, torch.bfloat16, 9, {"dropout_p": 0.5}),
    ("3d", 64, torch.bfloat16, 9, {}),
    ("value_width", 64, torch.bfloat16, 9, {}),  # values 32 wide
    ("broadcast_batch", 64, torch.bfloat16, 9, {}),  # keys and values of one batch for two queries
])
def test_fa4_attention_leaves_what_flash_attention_computes_otherwise(case, width, dtype, n_kv, kw):
    lead = (2,) if case == "3d" else (1, 2)
    inputs = [torch.randn(*lead, 9, width, dtype=dtype), *(torch.randn(*lead, n_kv, width, dtype=dtype)
                                                           for _ in range(2))]
    if case == "value_width":
        inputs[2] = inputs[2][..., :32]
    if case == "broadcast_batch":
        inputs[0] = torch.randn(2, 2, 9, width, dtype=dtype)
    _, sites, targets = _rewritten(Sdpa(**kw), inputs)
    assert sites == 0 and FA4 not in targets and aten.scaled_dot_product_attention.default in targets


@pytest.mark.parametrize("capability, offered", [((9, 0), True), ((10, 0), True), ((8, 0), False), ((12, 0), False)])
def test_fa4_attention_is_offered_only_where_flash_attention_runs(monkeypatch, caplog, stand_in, capability,
                                                                  offered):
    r = REWRITES["fa4-attention"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert r.applies_to("cuda") is offered and r.applies_to("cuda:0") is offered and not r.applies_to("cpu")
    monkeypatch.setattr(rf, "_load", lambda: (None, "ImportError: no flash_attn"))  # not installed
    monkeypatch.setattr(rf, "fa4", lambda: None)
    rf._say_missing.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=rf.__name__):
            assert not r.applies_to("cuda") and not r.applies_to("cuda")
    finally:
        rf._say_missing.cache_clear()
    said = [m for m in caplog.messages if "FlashAttention 4 does not import" in m]
    assert len(said) == (1 if offered else 0)  # said once, and only where it would run
    assert not said or ("(ImportError: no flash_attn)" in said[0] and "forge-kernels[fa4]" in said[0])


def test_fa4_attention_fake_gives_the_layout_of_the_op():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.empty(2, 24, 4429, 64, dtype=torch.bfloat16) for _ in range(3))
        out = FA4(q, k, v, 0.125, False)
    assert out.shape == (2, 24, 4429, 64) and out.transpose(1, 2).is_contiguous()


@pytest.mark.cuda
def test_fa4_attention_matches_sdpa_on_the_gpu_replayed_and_compiled():
    if not rf.available("cuda"):
        pytest.skip("FlashAttention 4 is not installed, or this GPU is neither Hopper nor Blackwell")
    torch.manual_seed(4)
    q, k, v, cq, ck, cv = (torch.randn(2, 24, n, 64, dtype=torch.bfloat16, device="cuda")
                           for n in (1024, 1024, 1024, 77, 77, 77))
    model, inputs = Joint(), [q, k, v, cq, ck, cv]
    opt, sites, _ = _rewritten(model, inputs)
    assert sites == 1
    with torch.no_grad():
        want = model(*inputs)
        torch.testing.assert_close(opt(*inputs), want, rtol=2e-2, atol=2e-2)
        replay = apply(model, inputs, [], cuda_graph=True)
        assert rf.Fa4Attention().apply(Graph(replay.gm, replay._template, replay._user_slots)) == 1
        replay.gm.graph.eliminate_dead_code()
        replay.gm.recompile()
        for _ in range(3):
            torch.testing.assert_close(replay(*inputs), want, rtol=2e-2, atol=2e-2)
        assert replay.cuda_graph and not replay.graph_error  # captured and replayed, not run op by op
        torch.testing.assert_close(torch.compile(opt)(*inputs), want, rtol=2e-2, atol=2e-2)
    causal = Heads(8, 2, is_causal=True, enable_gqa=True)
    inputs = [_tokens(1, 300, 8 * 128, device="cuda"), *(_tokens(1, 300, 2 * 128, device="cuda") for _ in range(2))]
    opt, sites, _ = _rewritten(causal, inputs)
    assert sites == 1
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), causal(*inputs), rtol=2e-2, atol=2e-2)
    for window, n_q in ((None, 700), (512, 700), (64, 300)):  # Gemma 4's sliding layers; a prefill after a cache
        q = torch.randn(1, 8, n_q, 256, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.randn(1, 1, 700, 256, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        model = Positional(window)
        opt, sites, _ = _rewritten(model, [q, k, v])
        assert sites == 1
        with torch.no_grad():
            torch.testing.assert_close(opt(q, k, v), model(q, k, v), rtol=2e-2, atol=2e-2)


class Positional(nn.Module):
    """Attention with a mask built from token positions, as transformers builds it (Gemma 4: one key/value head
    expanded over the query heads, scale 1): causal, a sliding window of `window` keys, or (`odd`) a mask that
    is neither."""

    def __init__(self, window: int | None = None, odd: bool = False) -> None:
        super().__init__()
        self.window, self.odd = window, odd

    def forward(self, q, k, v):
        n_q, n_k = q.shape[2], k.shape[2]
        i = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
        j = torch.arange(n_k, device=q.device)[None, :]
        mask = j <= i
        if self.window is not None:
            mask = mask & (j > i - self.window)
        if self.odd:
            mask = mask & ((j % 2 == 0) | (j == i))
        h = q.shape[1]
        k, v = k.expand(-1, h, -1, -1), v.expand(-1, h, -1, -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None].expand(1, 1, -1, -1), scale=1.0)


@pytest.mark.parametrize("window, n_q, n_k", [(None, 33, 33), (8, 33, 33), (8, 5, 21), (40, 33, 33)])
def test_fa4_attention_takes_causal_and_sliding_window_masks_built_from_positions(stand_in, window, n_q, n_k):
    torch.manual_seed(5)
    q = torch.randn(1, 4, n_q, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 1, n_k, 64, dtype=torch.bfloat16) for _ in range(2))
    model = Positional(window)
    opt, sites, targets = _rewritten(model, [q, k, v])
    assert sites == 1 and aten.scaled_dot_product_attention.default not in targets
    with torch.no_grad():
        torch.testing.assert_close(opt(q, k, v), model(q, k, v), rtol=2e-2, atol=2e-2)
    q_shape, k_shape, scale, causal, _, window_size = stand_in[-1]
    assert causal and scale == 1.0 and k_shape[2] == 1  # the expanded key head went as one (grouped-query)
    assert window_size == ((window - 1, 0) if window is not None and window < n_k else (None, None))


def test_fa4_attention_leaves_masks_it_cannot_compute_from_indices(stand_in):
    q = torch.randn(1, 4, 17, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 1, 17, 64, dtype=torch.bfloat16) for _ in range(2))
    _, sites, _ = _rewritten(Positional(odd=True), [q, k, v])  # computed from positions, but not a band
    assert sites == 0

    class Given(nn.Module):  # the mask is an input: its value is the caller's
        def forward(self, q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    q, k, v = (torch.randn(1, 2, 9, 64, dtype=torch.bfloat16) for _ in range(3))
    _, sites, _ = _rewritten(Given(), [q, k, v, torch.ones(9, 9, dtype=torch.bool).tril()])
    assert sites == 0


def test_a_mask_is_judged_at_each_shape_and_never_from_a_buffer(stand_in):
    class Shared(nn.Module):  # one all-True mask over the keys, broadcast over 1 query and then over 8
        def forward(self, q1, q8, k, v):
            mask = (torch.arange(k.shape[2]) >= 0)[None, :]
            return (F.scaled_dot_product_attention(q1, k, v, attn_mask=mask).sum()
                    + F.scaled_dot_product_attention(q8, k, v, attn_mask=mask).sum())

    q1, q8 = torch.randn(1, 2, 1, 64, dtype=torch.bfloat16), torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 12, 64, dtype=torch.bfloat16) for _ in range(2))
    opt, sites, _ = _rewritten(Shared(), [q1, q8, k, v])
    assert sites == 1  # causal for the one query (it sees every key); for eight it is no band
    with torch.no_grad():
        torch.testing.assert_close(opt(q1, q8, k, v), Shared()(q1, q8, k, v), rtol=2e-2, atol=2e-1)

    class Stateful(nn.Module):  # the window is a buffer, which a forward may change: the mask is not a constant
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("window", torch.tensor(4))

        def forward(self, q, k, v):
            i, j = torch.arange(q.shape[2])[:, None], torch.arange(k.shape[2])[None, :]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - self.window))

    q, k, v = (torch.randn(1, 2, 9, 64, dtype=torch.bfloat16) for _ in range(3))
    assert _rewritten(Stateful(), [q, k, v])[1] == 0


def test_a_band_is_recognised_only_where_it_is_one():
    i, j = torch.arange(6)[:, None] + 4, torch.arange(10)[None, :]  # 6 queries, the last of 10 keys
    assert rm.band(j <= i, 6, 10) == rm.CAUSAL
    assert rm.band((j <= i) & (j > i - 3), 6, 10) == 2
    assert rm.band(((j <= i) & (j > i - 3))[None, None].expand(2, 3, 6, 10), 6, 10) == 2
    heads = torch.stack([j <= i, (j <= i) & (j > i - 3)])[None]  # another band a head: not one mask
    assert rm.band(heads, 6, 10) is None
    assert rm.band((j <= i).float(), 6, 10) is None  # an additive mask
    assert rm.band(j <= i, 6, 11) is None and rm.band(j <= i - 4, 6, 10) is None  # other shape; top-left causal
    assert rm.band(torch.ones(10, 6, dtype=torch.bool), 10, 6) is None  # more queries than keys


def test_a_mask_of_a_meta_capture_is_not_evaluated():
    model, inputs = Positional(8), [torch.empty(1, 4, 9, 64, dtype=torch.bfloat16, device="meta"),
                                    *(torch.empty(1, 1, 9, 64, dtype=torch.bfloat16, device="meta") for _ in range(2))]
    from forge.capture.export import capture

    gm = capture(model, inputs).graph_module
    g = Graph(gm, [None] * sum(n.op == "placeholder" for n in gm.graph.nodes), [])
    sdpa = next(n for n in gm.graph.nodes if n.target == aten.scaled_dot_product_attention.default)
    assert rm.constant_value(g, sdpa.kwargs.get("attn_mask", sdpa.args[3] if len(sdpa.args) > 3 else None)) is None
