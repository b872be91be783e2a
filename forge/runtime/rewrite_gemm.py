"""Rewrites that hand work to the vendor GEMM (forge.runtime.rewrites has the table):

- `gelu-epilogue`: a matmul + bias followed by tanh-approximated GELU becomes one `_addmm_activation`
  call, whose GELU runs in cuBLASLt's epilogue (the pass over the matmul's output is gone); where cuBLASLt
  cannot take it, ATen runs addmm + tanh GELU. CUDA only: ATen's CPU `_addmm_activation` applies the exact
  (erf) GELU instead.
- `attention-gemm`: scaled dot-product attention with a head wider than the fused attention kernels take
  (> 256: only the memory-efficient kernel runs it, far from the GEMM's rate; Gemma 4's global layers, the
  SD3.5 VAE's mid-block) becomes two batched GEMMs around a (masked) softmax: scores in float32 (`bmm`
  with a float32 result on CUDA), softmax in float32, the probabilities in the value's dtype, as flash
  attention rounds them. Queries go in chunks so that the scores of one chunk stay under CHUNK elements.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from forge.runtime.rewrite_base import Graph, Rewrite, is_op, only_user, outputs_row_major, sdpa_call

aten = torch.ops.aten

CHUNK = 1 << 26  # score elements a chunk of queries (256 MiB in float32)
WIDE = 256  # head widths above this are beyond the flash and cuDNN attention kernels


class GeluEpilogue(Rewrite):
    """addmm (+ view) + gelu(approximate='tanh') -> _addmm_activation(use_gelu=True) (+ view)."""

    name = "gelu-epilogue"
    devices = ("cuda",)
    # Inductor keeps cuBLASLt's fused GELU and fuses the rest around it: on the SD3.5 MMDiT on the H200 46.2 ms
    # compiled (5a9cce5) against 47-48 for the model compiled, while uncompiled it is within the noise (79.99
    # against 80.74 at e34638f, not kept)
    pays_compiled = True

    def apply(self, g: Graph) -> int:
        sites = 0
        for gelu in list(g.graph.nodes):
            if not is_op(gelu, aten.gelu.default) or _approximate(gelu) != "tanh":
                continue
            mm, user = gelu.args[0], gelu  # addmm, or a view of it, read by this GELU alone
            if is_op(mm, aten.view.default, aten.reshape.default, aten._unsafe_view.default) and \
                    only_user(mm) is gelu:
                mm, user = mm.args[0], mm
            if not is_op(mm, aten.addmm.default) or mm.kwargs or len(mm.args) != 3 or only_user(mm) is not user:
                continue
            bias, a, wt = mm.args
            bv, val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None, mm.meta.get("val")
            if not isinstance(bv, torch.Tensor) or not isinstance(val, torch.Tensor) or \
                    tuple(bv.shape) != (val.shape[-1],):
                continue  # a broadcast or scalar bias: cuBLASLt's epilogue takes a vector
            fused = g.call(aten._addmm_activation.default, (bias, a, wt), mm, like=mm,
                           kwargs={"use_gelu": True})
            mm.replace_all_uses_with(fused)
            gelu.replace_all_uses_with(gelu.args[0])
            sites += 1
        return sites


def _approximate(gelu: torch.fx.Node) -> str:
    return str(gelu.kwargs.get("approximate", gelu.args[1] if len(gelu.args) > 1 else "none"))


class AttentionGemm(Rewrite):
    """Attention (masked, causal or grouped too; no dropout) with a head wider than WIDE -> attention_by_gemm."""

    name = "attention-gemm"
    pays_compiled = True  # scale, mask, softmax and cast: four passes over the scores eager, one compiled

    def apply(self, g: Graph) -> int:
        sites = 0
        for sdpa in list(g.graph.nodes):
            if (call := sdpa_call(sdpa)) is None:
                continue
            q, k, v = (call[n].meta.get("val") for n in ("query", "key", "value"))
            mask = call.get("attn_mask")
            if call.get("dropout_p", 0.0) or not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or \
                    (mask is not None and not isinstance(mask, torch.fx.Node)):
                continue
            if q.dim() < 3 or q.shape[-1] <= WIDE or q.dtype not in (torch.float32, torch.float16, torch.bfloat16) \
                    or not _heads_fit(q, k, v, bool(call.get("enable_gqa"))):
                continue
            if call.get("is_causal") and mask is not None:
                continue  # SDPA refuses both
            new = g.call(attention_by_gemm, (call["query"], call["key"], call["value"], mask, call.get("scale"),
                                             bool(call.get("is_causal"))), sdpa, like=sdpa)
            sdpa.replace_all_uses_with(new)
            g.graph.erase_node(sdpa)  # tagged nondeterministic (dropout): dead-code elimination keeps it
            sites += 1
        if sites:  # eager's attention output may come back in another layout: a graph output stays as eager's
            outputs_row_major(g)
        return sites


def _heads_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> bool:
    """The leading dimensions agree, or (grouped-query attention) only the head counts differ, evenly."""
    if k.shape[:-2] != v.shape[:-2] or k.shape[-1] != q.shape[-1]:
        return False
    if q.shape[:-2] == k.shape[:-2]:
        return True
    return gqa and q.dim() >= 4 and q.shape[:-3] == k.shape[:-3] and q.shape[-3] % k.shape[-3] == 0


def attention_by_gemm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                      scale: float | None = None, causal: bool = False) -> torch.Tensor:
    """SDPA's softmax(q k^T * scale + mask) v as batched GEMMs, queries in chunks. `mask`: boolean (True takes
    part) or added to the scores, broadcast to (..., queries, keys); `causal`: the top-left lower triangle.
    Heads that read one key/value head (grouped-query attention, or keys expanded over the heads with
    stride 0) share one GEMM: their queries are rows of the same product."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    *lead, n_q, e = q.shape
    n_kv, ev = k.shape[-2], v.shape[-1]
    if q.dim() >= 4 and k.stride(-3) == 0 and v.stride(-3) == 0:  # one key/value head read by every head
        k, v = k.narrow(-3, 0, 1), v.narrow(-3, 0, 1)
    kv_heads = k.shape[-3] if q.dim() >= 4 else 1
    group = (q.shape[-3] // kv_heads) if q.dim() >= 4 else 1  # query heads per key/value head
    b = math.prod(lead) // group  # GEMMs in the batch: one per key/value head
    q5 = q.reshape(b, group, n_q, e)
    kt, v3 = k.reshape(b, n_kv, e).transpose(1, 2), v.reshape(b, n_kv, ev)
    if causal:
        mask = torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device).tril()
    if mask is not None:  # every query row its own mask row, so that a chunk of queries slices it
        mask = mask.reshape(1, -1) if mask.dim() < 2 else mask
        mask = mask.expand(*mask.shape[:-2], n_q, n_kv)
    if n_q == 0:
        return q.new_empty(*lead, 0, ev)
    rows = max(1, CHUNK // max(1, math.prod(lead) * n_kv))
    outs = []
    for i in range(0, n_q, rows):
        r = min(rows, n_q - i)
        scores = _scores(q5[:, :, i:i + r].reshape(b, group * r, e), kt).view(*lead, r, n_kv) * scale
        if mask is not None:
            part = mask[..., i:i + r, :]
            scores = scores.masked_fill(~part, float("-inf")) if part.dtype == torch.bool else scores + part
            probs = aten._safe_softmax(scores, -1)  # a row that takes no key is zeros, as SDPA gives
        else:
            probs = torch.softmax(scores, -1)
        outs.append(torch.bmm(probs.to(v.dtype).view(b, group * r, n_kv), v3).view(*lead, r, ev))
    return outs[0] if len(outs) == 1 else torch.cat(outs, -2)


def _scores(q: torch.Tensor, kt: torch.Tensor) -> torch.Tensor:
    """q @ kt in float32: on CUDA a half-precision GEMM with a float32 result, elsewhere in float32."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return aten.bmm.dtype(q, kt, torch.float32)
    return torch.bmm(q.float(), kt.float())

