"""Whole-graph rewrites of a captured (and possibly patched) ATen graph, for inference.

Each rewrite changes the graph into one that computes the same function with fewer or cheaper device
passes; none is assumed to pay: forge.runtime.variants keeps a rewrite only when the whole forward gets faster
with outputs matching. The rewrites (REWRITES is the one table of them):

- `fold-bn`: an eval-mode BatchNorm after a convolution is folded into the convolution's weight and bias
  (w' = w * gamma / sqrt(var + eps), b' = (b - mean) * gamma / sqrt(var + eps) + beta, computed in float32).
- `channels-last`: 4-d convolution weights in channels-last layout, so that convolutions (cuDNN, oneDNN)
  run NHWC and their outputs stay NHWC through the ops after them; 4-d graph outputs, and the inputs of ops
  whose CUDA kernels take only row-major ones (ROW_MAJOR_INPUT), are made row-major again, as eager has them.
- `merge-linears`: matmuls that read the same input with constant weights (Q, K and V; gate and up)
  become one matmul on the concatenated weights, sliced afterwards.
- `gelu-epilogue`, `attention-gemm`: see forge.runtime.rewrite_gemm (GELU in cuBLASLt's epilogue; attention with
  wide heads as two GEMMs around a softmax).
- `fa4-attention` (CUDA, where FlashAttention 4 is installed): see forge.runtime.rewrite_fa4.
- `cudnn-epilogue` (CUDA): convolution (+ bias) + ReLU, and convolution + residual add + ReLU, become
  cuDNN's fused `cudnn_convolution_relu` / `cudnn_convolution_add_relu` (the epilogue runs inside the
  convolution: the pass over its output is gone).

Constants (parameters and buffers) are read from the graph's argument template; new constants (folded or
concatenated weights) become attributes of the graph module (`get_attr` nodes).
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.fx

from forge.runtime.rewrite_base import Graph, Rewrite, is_op, only_user, outputs_row_major, row_major, same_meta
from forge.runtime.rewrite_fa4 import Fa4Attention
from forge.runtime.rewrite_gemm import AttentionGemm, GeluEpilogue

log = logging.getLogger(__name__)
aten = torch.ops.aten


class FoldBatchNorm(Rewrite):
    """Eval-mode BatchNorm after a convolution, folded into the convolution.

    Important: only `_native_batch_norm_legit_no_training` (running statistics, the op of a BatchNorm in eval
    mode) is folded. A BatchNorm in training mode is `_native_batch_norm_legit_functional` in the graph (the
    batch's statistics, running ones updated): another function, never folded."""

    name = "fold-bn"

    def apply(self, g: Graph) -> int:
        sites = 0
        for bn in list(g.graph.nodes):
            if not is_op(bn, aten._native_batch_norm_legit_no_training.default):
                continue
            conv, gamma, beta, mean, var, _momentum, eps = bn.args
            if not is_op(conv, aten.convolution.default) or only_user(conv) is not bn or conv.args[6]:
                continue  # not a (non-transposed) convolution read by this BatchNorm alone
            w, b = g.const(conv.args[1]), g.const(conv.args[2]) if conv.args[2] is not None else None
            stats = [g.const(a) if a is not None else None for a in (gamma, beta, mean, var)]
            if w is None or (conv.args[2] is not None and b is None) or any(
                    s is None and a is not None for s, a in zip(stats, (gamma, beta, mean, var), strict=True)) \
                    or mean is None or var is None:
                continue  # a statistic or an affine parameter that is computed, not a constant
            outs = list(bn.users)
            if not all(is_op(u, operator.getitem) and u.args[1] == 0 for u in outs):
                continue  # the batch statistics outputs are read: not an inference BatchNorm
            acc = torch.promote_types(w.dtype, torch.float32)  # fold in float32 at least (float64 stays float64)
            gm_, bt, mu, vr = (s.to(acc) if s is not None else None for s in stats)
            scale = (gm_ if gm_ is not None else 1.0) / torch.sqrt(vr + float(eps))
            new_w = (w.to(acc) * scale.reshape(-1, *([1] * (w.dim() - 1)))).to(w.dtype)
            new_b = ((b.to(acc) if b is not None else 0.0) - mu) * scale + (bt if bt is not None else 0.0)
            new_b = new_b.to(w.dtype)
            args = list(conv.args)
            args[1], args[2] = g.add_const(new_w, conv, "w"), g.add_const(new_b, conv, "b")
            folded = g.call(aten.convolution.default, tuple(args), conv, like=conv)
            for u in outs:
                u.replace_all_uses_with(folded)
            sites += 1
        return sites


class ChannelsLast(Rewrite):
    """4-d convolution weights channels-last (so activations run NHWC); 4-d outputs row-major again."""

    name = "channels-last"

    def apply(self, g: Graph) -> int:
        if any(is_op(n, aten.as_strided.default) for n in g.graph.nodes):
            return 0  # explicit strides would read NHWC buffers as if they were NCHW
        sites = 0
        for conv in list(g.graph.nodes):
            if not is_op(conv, aten.convolution.default, aten.cudnn_convolution_relu.default,
                       aten.cudnn_convolution_add_relu.default):
                continue
            w = g.const(conv.args[1])
            if w is None or w.dim() != 4 or w.is_contiguous(memory_format=torch.channels_last) and \
                    not w.is_contiguous():
                continue
            conv.update_arg(1, g.add_const(w.contiguous(memory_format=torch.channels_last), conv, "w_nhwc"))
            sites += 1
        if sites:
            for n in list(g.graph.nodes):  # what must still read a row-major input gets one
                if is_op(n, *ROW_MAJOR_INPUT) and isinstance(n.args[0], torch.fx.Node):
                    n.update_arg(0, g.call(row_major, (n.args[0],), n, like=n.args[0]))
            outputs_row_major(g)
        return sites


# ATen ops whose CUDA kernels check that their first input is row-major: `aten.group_norm` makes it so before
# it calls `native_group_norm`, the captured graph calls `native_group_norm` itself (on the H200 a conv +
# GroupNorm model's channels-last variant failed "Expected X.is_contiguous(memory_format)")
ROW_MAJOR_INPUT = (aten.native_group_norm.default,)


class MergeLinears(Rewrite):
    """Matmuls of one input by constant weights: one matmul on the concatenated weights, then slices."""

    name = "merge-linears"

    def apply(self, g: Graph) -> int:
        groups: dict[tuple[Any, ...], list[torch.fx.Node]] = {}
        for mm in g.graph.nodes:
            site = self._site(g, mm)
            if site is not None:
                groups.setdefault(site, []).append(mm)
        sites = 0
        for mms in groups.values():
            if len(mms) > 1:
                self._merge(g, mms)
                sites += 1
        if sites:
            outputs_row_major(g)
        return sites

    @staticmethod
    def _source(a: torch.fx.Node) -> tuple[Any, ...]:
        """What a matmul's left operand is: the tensor it views, and the view's shape."""
        if is_op(a, aten.view.default, aten.reshape.default, aten._unsafe_view.default):
            return (a.args[0], tuple(a.args[1]))
        return (a, None)

    def _site(self, g: Graph, mm: torch.fx.Node) -> tuple[Any, ...] | None:
        if is_op(mm, aten.mm.default):
            a, wt, bias = mm.args[0], mm.args[1], None
        elif is_op(mm, aten.addmm.default) and not mm.kwargs and len(mm.args) == 3:
            bias, a, wt = mm.args
            if g.const(bias) is None:
                return None
        else:
            return None
        if not (is_op(wt, aten.permute.default) and list(wt.args[1]) == [1, 0]) or g.const(wt.args[0]) is None:
            return None
        w = g.const(wt.args[0])
        if w.dim() != 2 or bias is not None and tuple(g.const(bias).shape) != (w.shape[0],):
            return None  # a broadcast bias: left alone
        return (*self._source(a), w.dtype, w.device, w.shape[1])

    def _merge(self, g: Graph, mms: list[torch.fx.Node]) -> None:
        first = mms[0]  # graph order: every other matmul and its users come after it
        ws = [g.const((mm.args[1] if mm.target == aten.mm.default else mm.args[2]).args[0]) for mm in mms]
        biases = [g.const(mm.args[0]) if mm.target == aten.addmm.default else None for mm in mms]
        a = first.args[0] if first.target == aten.mm.default else first.args[1]
        w_node = g.add_const(torch.cat(ws, 0), first, "w_cat")
        wt = g.call(aten.permute.default, (w_node, [1, 0]), first)
        if any(b is not None for b in biases):
            b_cat = torch.cat([b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
                               for b, w in zip(biases, ws, strict=True)])
            merged = g.call(aten.addmm.default, (g.add_const(b_cat, first, "b_cat"), a, wt), first)
        else:
            merged = g.call(aten.mm.default, (a, wt), first)
        val = first.meta.get("val")
        if isinstance(val, torch.Tensor):
            merged.meta["val"] = val.new_empty((val.shape[0], sum(w.shape[0] for w in ws)))
        start = 0
        for mm, w in zip(mms, ws, strict=True):
            part = g.call(aten.slice.Tensor, (merged, 1, start, start + w.shape[0]), first, like=mm)
            mm.replace_all_uses_with(part)
            start += w.shape[0]


class CudnnEpilogue(Rewrite):
    """Convolution (+ bias) [+ residual] + ReLU as one cuDNN call with the epilogue fused."""

    name = "cudnn-epilogue"
    devices = ("cuda",)
    after = ("fold-bn",)

    def apply(self, g: Graph) -> int:
        sites = 0
        for relu in list(g.graph.nodes):
            if not is_op(relu, aten.relu.default):
                continue
            src = relu.args[0]
            conv, z = src, None
            if is_op(src, aten.add.Tensor) and only_user(src) is relu and len(src.args) == 2 and not src.kwargs:
                for c, other in ((src.args[0], src.args[1]), (src.args[1], src.args[0])):
                    if self._fusible(c) and only_user(c) is src and isinstance(other, torch.fx.Node) and \
                            same_meta(c, other):
                        conv, z = c, other
                        break
            if not self._fusible(conv) or only_user(conv) is not (src if z is not None else relu):
                continue
            x, w, b, stride, padding, dilation, _t, _op, groups = conv.args
            if z is None:
                new = g.call(aten.cudnn_convolution_relu.default, (x, w, b, stride, padding, dilation, groups),
                             relu, like=relu)
            else:
                new = g.call(aten.cudnn_convolution_add_relu.default,
                             (x, w, z, 1.0, b, stride, padding, dilation, groups), relu, like=relu)
            relu.replace_all_uses_with(new)
            sites += 1
        return sites

    @staticmethod
    def _fusible(conv: Any) -> bool:
        if not is_op(conv, aten.convolution.default):
            return False
        val = conv.meta.get("val")
        transposed, output_padding = conv.args[6], conv.args[7]
        return (not transposed and not any(output_padding) and isinstance(val, torch.Tensor) and val.dim() == 4
                and val.dtype in (torch.float32, torch.float16, torch.bfloat16))


REWRITES: dict[str, Rewrite] = {r.name: r for r in (FoldBatchNorm(), MergeLinears(), GeluEpilogue(),
                                                     AttentionGemm(), Fa4Attention(), CudnnEpilogue(),
                                                     ChannelsLast())}


def parse(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Rewrite names checked against REWRITES, in the table's order; ValueError on an unknown one."""
    unknown = [n for n in names if n not in REWRITES]
    if unknown:
        raise ValueError(f"Invalid rewrite {unknown[0]!r}: choose from {', '.join(REWRITES)}")
    return tuple(n for n in REWRITES if n in names)


def rewrite(gm: torch.fx.GraphModule, template: list[Any], user_slots: list[int], names: tuple[str, ...],
            device: str) -> dict[str, int]:
    """Apply the named rewrites (in the table's order) to `gm` in place; sites rewritten per rewrite."""
    g = Graph(gm, template, user_slots)
    done = {}
    for name in parse(names):
        r = REWRITES[name]
        if r.applies_to(device):
            done[name] = r.apply(g)
            g.graph.eliminate_dead_code()
            log.info("rewrite %s: %d sites", name, done[name])
        else:  # a result loaded where its rewrite cannot run (fa4-attention without FlashAttention 4)
            log.warning("rewrite %s does not apply on %s here: left out (outputs stay, its speed goes)", name, device)
    g.finish()
    return done


def _register_fakes() -> None:
    """Shapes of cuDNN's fused convolutions for torch.compile's fake tensors (ATen registers none)."""
    def conv_relu(x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, groups: Any) -> Any:
        out = torch.ops.aten.convolution.default(x, w, b, stride, padding, dilation, False, [0, 0], groups)
        return out.contiguous(memory_format=_format_of(x, w))

    def conv_add_relu(x: Any, w: Any, z: Any, alpha: Any, b: Any, stride: Any, padding: Any, dilation: Any,
                      groups: Any) -> Any:
        return conv_relu(x, w, b, stride, padding, dilation, groups)

    for op, fn in (("cudnn_convolution_relu", conv_relu), ("cudnn_convolution_add_relu", conv_add_relu)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "Meta"):
            try:
                torch.library.register_fake(f"aten::{op}", fn, lib=_LIB)
            except RuntimeError as e:  # a torch that registers its own: nothing to add
                log.debug("no fake for aten::%s registered: %s", op, e)


def _format_of(x: torch.Tensor, w: torch.Tensor) -> torch.memory_format:
    cl = torch.channels_last
    return cl if (x.is_contiguous(memory_format=cl) and not x.is_contiguous()) or \
        (w.is_contiguous(memory_format=cl) and not w.is_contiguous()) else torch.contiguous_format


_LIB = torch.library.Library("aten", "FRAGMENT")
_register_fakes()
