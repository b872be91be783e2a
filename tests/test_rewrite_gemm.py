"""gelu-epilogue and attention-gemm: outputs match eager on odd sizes, chunk tails and non-contiguous strides."""

import pytest
import torch
from torch import nn

import forge.runtime.rewrite_gemm as rg
from forge.runtime.dispatch import apply
from forge.runtime.rewrites import rewrite

aten = torch.ops.aten
F = torch.nn.functional


class Mlp(nn.Module):
    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        self.fc1, self.fc2, self.approximate = nn.Linear(19, 23), nn.Linear(23, 7), approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class Attention(nn.Module):
    def __init__(self, scale: float | None = None, **kw) -> None:
        super().__init__()
        self.scale, self.kw = scale, kw

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, scale=self.scale, **self.kw) * 2


def _rewritten(model: nn.Module, inputs: list, name: str, device: str = "cpu"):
    opt = apply(model, inputs, [])
    sites = rewrite(opt.gm, opt._template, opt._user_slots, (name,), device)
    return opt, sites.get(name, 0), [n.target for n in opt.gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("shape, transposed", [((3, 5, 19), False), ((4, 19), False), ((19, 6), True)])
def test_gelu_epilogue_wires_the_fused_call_as_the_matmul_and_gelu_were(shape, transposed):
    """The rewrite is for CUDA (cuBLASLt's GELU is the tanh one); rewritten for CUDA and run here on the CPU,
    where ATen's _addmm_activation applies the exact GELU, the graph must equal the exact-GELU model: the
    bias, operands and views went where they were."""
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(shape).t() if transposed else torch.randn(shape)  # (6, 19) read with strides (1, 6)
    assert _rewritten(model, [x], "gelu-epilogue")[1] == 0  # not a CPU rewrite
    opt, sites, targets = _rewritten(model, [x], "gelu-epilogue", device="cuda")
    assert sites == 1
    assert aten._addmm_activation.default in targets and aten.gelu.default not in targets
    exact = Mlp("none").eval()
    exact.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(opt(x), exact(x), rtol=1e-5, atol=1e-5)


def test_gelu_epilogue_leaves_the_exact_gelu_alone():
    opt, sites, targets = _rewritten(Mlp("none").eval(), [torch.randn(3, 19)], "gelu-epilogue", device="cuda")
    assert sites == 0 and aten.gelu.default in targets


def _qkv(b: int, h: int, n_q: int, n_kv: int, e: int, ev: int, permuted: bool) -> list[torch.Tensor]:
    if permuted:  # as a model makes them: (batch, tokens, heads, width) transposed to heads first
        return [torch.randn(b, n, h, w).transpose(1, 2) for n, w in ((n_q, e), (n_kv, e), (n_kv, ev))]
    return [torch.randn(b, h, n, w) for n, w in ((n_q, e), (n_kv, e), (n_kv, ev))]


@pytest.mark.parametrize("scale, chunk, permuted", [(None, 1 << 26, False), (0.3, 2 * 3 * 29 * 5, True),
                                                    (None, 1, True)])
def test_attention_gemm_matches_sdpa_on_wide_heads_with_chunk_tails(monkeypatch, scale, chunk, permuted):
    torch.manual_seed(1)
    monkeypatch.setattr(rg, "CHUNK", chunk)  # 5 query rows a chunk: 37 = 7 x 5 + a tail of 2 (or 1 row)
    inputs = _qkv(2, 3, 37, 29, 260, 33, permuted)
    model = Attention(scale)
    opt, sites, targets = _rewritten(model, inputs, "attention-gemm")
    assert sites == 1 and aten.scaled_dot_product_attention.default not in targets
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)


def test_attention_gemm_leaves_narrow_heads_alone():
    inputs = _qkv(1, 2, 9, 9, 64, 64, False)
    _, sites, targets = _rewritten(Attention(), inputs, "attention-gemm")
    assert sites == 0 and aten.scaled_dot_product_attention.default in targets


class Masked(nn.Module):
    def forward(self, q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=1.0) + 1


class Expanded(nn.Module):
    """Gemma's global layers: one key/value head expanded over the query heads (stride 0), a boolean mask
    [1, 1, queries, keys] expanded too, scale 1."""

    def forward(self, q, k, v, m):
        h = q.shape[1]
        k, v = k.expand(-1, h, -1, -1), v.expand(-1, h, -1, -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m.expand(1, -1, -1, -1), scale=1.0)


def _causal_bool(n_q: int, n_kv: int) -> torch.Tensor:
    """A boolean mask with every row taking part somewhere: causal plus random holes off the diagonal."""
    m = torch.ones(n_q, n_kv, dtype=torch.bool).tril() & (torch.rand(n_q, n_kv) > 0.3)
    return m | torch.eye(n_q, n_kv, dtype=torch.bool)


@pytest.mark.parametrize("chunk", [1 << 26, 4 * 29 * 3])
@pytest.mark.parametrize("case", ["causal", "bool", "float", "expanded", "gqa", "padding", "empty_row"])
def test_attention_gemm_matches_masked_causal_and_grouped_attention(monkeypatch, case, chunk):
    torch.manual_seed(3)
    monkeypatch.setattr(rg, "CHUNK", chunk)  # 3 query rows a chunk over 4 heads (a tail of 1 of 37)
    if case == "causal":
        model, inputs = Attention(0.2, is_causal=True), _qkv(2, 4, 37, 29, 260, 33, True)
    elif case in ("bool", "float"):
        m = _causal_bool(37, 29)
        if case == "float":
            m = torch.where(m, torch.randn(37, 29), float("-inf"))
        model, inputs = Masked(), [*_qkv(2, 4, 37, 29, 260, 33, True), m]
    elif case == "padding":  # one mask row for every query (B, 1, 1, keys), as padding masks are
        m = torch.rand(2, 1, 1, 29) > 0.3
        m[..., 0] = True
        model, inputs = Masked(), [*_qkv(2, 4, 37, 29, 260, 33, True), m]
    elif case == "empty_row":  # a query that takes no key: SDPA gives zeros there, not NaN
        m = _causal_bool(37, 29)
        m[5] = False
        model, inputs = Masked(), [*_qkv(2, 4, 37, 29, 260, 33, True), m]
    elif case == "expanded":
        q, k, v = _qkv(1, 4, 37, 29, 260, 260, True)
        model, inputs = Expanded(), [q, k[:, :1], v[:, :1], _causal_bool(37, 29)[None, None]]
    else:
        q, k, v = _qkv(2, 4, 37, 29, 260, 33, True)
        model, inputs = Attention(enable_gqa=True), [q, k[:, :2], v[:, :2]]
    opt, sites, targets = _rewritten(model, inputs, "attention-gemm")
    assert sites == 1 and aten.scaled_dot_product_attention.default not in targets
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), model(*inputs), rtol=1e-4, atol=3e-5)  # 260-wide fp32 dots


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_rewrites_run_and_match_eager_on_the_gpu(dtype):
    torch.manual_seed(2)
    inputs = [t.to("cuda", dtype) for t in _qkv(1, 1, 1000, 1000, 512, 512, True)]
    opt, sites, _ = _rewritten(Attention(), inputs, "attention-gemm")
    assert sites == 1
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), Attention()(*inputs), rtol=2e-2, atol=2e-2)
    q, k, v = (t.to("cuda", dtype) for t in _qkv(1, 8, 1000, 1000, 512, 512, True))
    inputs = [q, k[:, :1], v[:, :1], _causal_bool(1000, 1000)[None, None].cuda()]
    opt, sites, _ = _rewritten(Expanded(), inputs, "attention-gemm")
    assert sites == 1
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), Expanded()(*inputs), rtol=2e-2, atol=2e-2)
    model = Mlp().to("cuda", dtype).eval()
    x = torch.randn(64, 19, device="cuda", dtype=dtype)
    opt, sites, _ = _rewritten(model, [x], "gelu-epilogue", device="cuda")
    assert sites == 1
    with torch.no_grad():
        torch.testing.assert_close(opt(x), model(x), rtol=2e-2, atol=2e-2)
