"""`fa4-attention` (CUDA, Hopper and Blackwell): scaled dot-product attention through FlashAttention 4.

FlashAttention 4 (the `flash-attn-4` package, kernels written in CuTe DSL: `flash_attn.cute`) is offered
where it imports and the GPU is a Hopper (sm_90) or Blackwell (sm_100) one; `pip install
'forge-kernels[fa4]'`. Like every rewrite it is kept only when the whole forward gets faster with outputs
matching (forge.runtime.variants): on the SD3.5 MMDiT, cuDNN's attention is already about 416 TFLOP/s on the
H200, and which is faster is a measurement, not an assumption.

Sites: attention without dropout, 4-d (batch, heads, tokens, head width), in float16 or bfloat16, with equal
query and value head widths that FlashAttention takes on both architectures (a multiple of 8 up to 128, or
256); `is_causal` only where queries and keys are as many (SDPA's causal mask is the top-left triangle,
FlashAttention's the bottom-right one: they differ otherwise); unmasked, or with a mask the graph computes
from positions alone that is causal or a sliding window (forge.runtime.rewrite_masks: Gemma 4's sliding
layers, whose window FlashAttention skips rather than masks); grouped-query attention where the query heads
are a multiple of the key/value heads, or one key/value head expanded over them. The inputs go to
FlashAttention as (batch, tokens, heads, width) views of SDPA's (batch, heads, tokens, width) ones (no copy
where the last dimension is contiguous: heads split off a linear's output, or concatenated along the tokens
as MMDiT's joint attention does); the output comes back as the same kind of view, so that merging the heads
after attention (tokens and heads swapped, then made contiguous) needs no copy: that clone is dropped (drop_copies).

The op is a torch custom op (`forge::fa4_attention`) with a fake implementation, so that the graph runs
under torch.compile (opaque to Inductor) and inside CUDA graphs (FlashAttention compiles its kernel on the
first call, in the warm-up before a capture).
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import warnings
from types import ModuleType

import torch
import torch.fx

from forge.runtime.rewrite_base import Graph, Rewrite, is_op, outputs_row_major, sdpa_call
from forge.runtime.rewrite_masks import band, constant_value

log = logging.getLogger(__name__)
aten = torch.ops.aten

ARCHS = (9, 10)  # compute capability majors: Hopper, Blackwell (data centre)

# CuTe DSL warns at each kernel compile that FlashAttention's aux_data is passed as a plain Python value
# (4.0.0b40 with CuTe DSL 4.8.1): their business, not the user's. Set here, not on import, which may run inside
# a warnings.catch_warnings() that would drop it.
warnings.filterwarnings("ignore", message=r"Argument aux_data .* cannot be converted to a JitArgument",
                        category=UserWarning)


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    """FlashAttention 4's interface and "", or None and why it does not import."""
    try:
        mod = importlib.import_module("flash_attn.cute.interface")
    except Exception as e:  # noqa: BLE001 - CuTe DSL or a missing library may raise anything on import
        return None, f"{type(e).__name__}: {e}"
    return mod, ""


def fa4() -> ModuleType | None:
    """FlashAttention 4's interface, or None where it does not import."""
    return _load()[0]


def available(device: str) -> bool:
    """Whether FlashAttention 4 imports and `device` is a GPU it runs on. On such a GPU without it, says once
    what the user misses."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(torch.device(device))[0] not in ARCHS:
        return False
    if fa4() is None:
        _say_missing()
        return False
    return True


@functools.cache
def _say_missing() -> None:
    log.info("fa4-attention (attention through FlashAttention 4) is not tried on this GPU: FlashAttention 4 does "
             "not import (%s); pip install 'forge-kernels[fa4]' adds it", _load()[1][:200])


def width_fits(d: int) -> bool:
    """Head widths FlashAttention 4 takes on Hopper and Blackwell alike."""
    return d % 8 == 0 and (8 <= d <= 128 or d == 256)


@torch.library.custom_op("forge::fa4_attention", mutates_args=())
def fa4_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                  window: int = -1) -> torch.Tensor:
    """softmax(q k^T * scale) v of (batch, heads, tokens, width) tensors by FlashAttention 4; `causal`: the mask
    aligned to the last query (bottom-right); `window` >= 0: each query takes only its own key and the `window`
    before it. The result is a (batch, heads, tokens, width) view of a (batch, tokens, heads, width) tensor."""
    mod = fa4()
    if mod is None:
        raise RuntimeError("fa4-attention needs FlashAttention 4: pip install 'forge-kernels[fa4]'")
    if k.stride(1) == 0 and v.stride(1) == 0:  # one key/value head expanded over the heads: grouped-query
        k, v = k[:, :1], v[:, :1]
    out = mod.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
                              causal=causal, window_size=(window, 0) if window >= 0 else (None, None))
    return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)


@fa4_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
      window: int = -1) -> torch.Tensor:
    return out_like(q, v)


def out_like(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An empty result of fa4_attention for these inputs, in its layout."""
    b, h, n, _ = q.shape
    return q.new_empty(b, n, h, v.shape[-1]).transpose(1, 2)


class Fa4Attention(Rewrite):
    """Attention (unmasked, causal or a sliding window) of the widths and dtypes FlashAttention 4 takes ->
    forge::fa4_attention."""

    name = "fa4-attention"
    devices = ("cuda",)

    def applies_to(self, device: str) -> bool:
        return super().applies_to(device) and available(device)

    def apply(self, g: Graph) -> int:
        made: list[torch.fx.Node] = []
        bands: dict[tuple, int | None] = {}  # each mask's band at each shape (the layers share masks)
        for sdpa in list(g.graph.nodes):
            if (call := sdpa_call(sdpa)) is None or not site(call):
                continue
            q, k = call["query"].meta["val"], call["key"].meta["val"]
            causal, window = bool(call.get("is_causal")), -1
            if (mask := call.get("attn_mask")) is not None:
                key = (mask, q.shape[2], k.shape[2])  # a mask broadcast over the queries serves other shapes
                if key not in bands:
                    bands[key] = mask_band(g, mask, q.shape[2], k.shape[2])
                if bands[key] is None:
                    continue  # a mask FlashAttention does not compute from indices
                causal, window = True, bands[key]
            scale = call.get("scale")
            scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
            new = g.call(torch.ops.forge.fa4_attention.default,
                         (call["query"], call["key"], call["value"], scale, causal, window), sdpa, like=sdpa)
            sdpa.replace_all_uses_with(new)
            g.graph.erase_node(sdpa)  # tagged nondeterministic (dropout): dead-code elimination keeps it
            made.append(new)
        if made:  # a graph output stays row-major as eager's: judged while the nodes carry SDPA's value
            outputs_row_major(g)
        for new in made:
            q, v = (a.meta.get("val") for a in new.args[:3:2])
            if isinstance(q, torch._subclasses.FakeTensor):  # from here on the value has the op's layout
                new.meta["val"] = out_like(q, v)
            drop_copies(new)
        return len(made)


def mask_band(g: Graph, mask: torch.fx.Node, n_q: int, n_k: int) -> int | None:
    """forge.runtime.rewrite_masks.band of a boolean mask the graph computes from no input; None otherwise."""
    val = mask.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype != torch.bool:
        return None  # an additive mask: not evaluated
    value = constant_value(g, mask)
    return None if value is None else band(value, n_q, n_k)


def drop_copies(node: torch.fx.Node) -> int:
    """The heads merged back after attention (tokens and heads swapped, then a contiguous clone) read the op's
    result with no copy: its (batch, tokens, heads, width) tensor is that layout already. Clones dropped."""
    dropped, val = 0, node.meta.get("val")
    for swap in list(node.users):
        if not (is_op(swap, aten.permute.default) and list(swap.args[1]) == [0, 2, 1, 3]) and \
                not (is_op(swap, aten.transpose.int) and sorted(swap.args[1:3]) == [1, 2]):
            continue
        clones = [c for c in swap.users if is_op(c, aten.clone.default) and
                  c.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format]
        for clone in clones:
            clone.replace_all_uses_with(swap)
        if clones and isinstance(val, torch._subclasses.FakeTensor):
            swap.meta["val"] = val.transpose(1, 2)
        dropped += len(clones)
    return dropped


def site(call: dict[str, object]) -> bool:
    """Whether an SDPA call (its arguments by name) is one FlashAttention 4 computes alike."""
    vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in
            (call.get("query"), call.get("key"), call.get("value"))]
    if not all(isinstance(t, torch.Tensor) for t in vals):
        return False
    q, k, v = vals
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if call.get("dropout_p", 0.0) or q.dim() != 4 or k.dim() != 4 or \
            v.dim() != 4 or q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
        return False
    if not width_fits(q.shape[-1]) or v.shape[-1] != q.shape[-1] or k.shape[-1] != q.shape[-1]:
        return False
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3]:
        return False
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads and not (call.get("enable_gqa") and heads % kv_heads == 0):
        return False
    mask = call.get("attn_mask")
    if mask is not None and (not isinstance(mask, torch.fx.Node) or call.get("is_causal")):
        return False  # a mask the graph does not compute, or a mask and causal together (SDPA refuses it)
    return not (call.get("is_causal") and q.shape[2] != k.shape[2])
