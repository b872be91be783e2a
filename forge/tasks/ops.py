"""What each ATen op is to forge: how it fuses (its kind) and which op family it belongs to.

Kinds drive the task cutter (forge.tasks.cut):
- HEAVY: matmul family, convolution, attention, pooling: a task of its own, left to vendor libraries
  unless a policy says otherwise;
- POINTWISE: elementwise math, casts, copies (fusible);
- VIEW: views and getitem of multi-output ops (fusible, free);
- FACTORY: constants made in the graph (`scalar_tensor`, `full`, `arange`; fusible, no inputs);
- REDUCE: reductions and normalizations (fusible; at most one per region);
- SINGLE: everything else (gather, cat, sort, ...): a task of its own; so is a scan (a library's loop captured
  as one op, forge.capture.scans), whose family is "scan".
"""

from __future__ import annotations

import operator
from enum import Enum
from typing import Any

import torch

from forge.capture.scans import is_scan

FAMILIES: tuple[str, ...] = (
    "arithmetic",
    "activation",
    "convolution/pooling",
    "matmul",
    "normalization",
    "attention",
    "quantization",
    "reduction",
    "logic",
    "shape",
    "resize/sampling",
    "signal",
    "sequence/control",
    "scan",  # a library's loop over chunks or steps, one op (forge.capture.scans): policies replace it whole
    "other",
)


class Kind(Enum):
    HEAVY = "heavy"
    POINTWISE = "pointwise"
    VIEW = "view"
    FACTORY = "factory"
    REDUCE = "reduce"
    SINGLE = "single"


# Names are OpOverloadPacket names (`aten.<name>`), so every overload shares its entry.
MATMUL = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "addmv", "mv", "dot", "_int_mm",
          "_scaled_mm", "einsum", "tensordot"}
CONV = {"convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "_convolution", "cudnn_convolution", "mkldnn_convolution"}
POOL = {"max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
        "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
        "_adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool3d", "adaptive_max_pool2d",
        "adaptive_max_pool1d", "adaptive_max_pool3d", "lp_pool2d"}
ATTENTION = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward",
             "_efficient_attention_forward", "flex_attention"}
NORMS = {"native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "native_batch_norm",
         "_native_batch_norm_legit", "batch_norm", "instance_norm", "rms_norm", "_fused_rms_norm",
         "_native_batch_norm_legit_functional"}
# Normalizations with fixed statistics: a per-channel scale and shift, so pointwise.
AFFINE_NORMS = {"_native_batch_norm_legit_no_training"}
SOFTMAX = {"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"}
REDUCTIONS_EXTRA = {"var_mean", "logsumexp", "norm", "linalg_vector_norm", "std_mean", "aminmax"}
FACTORIES = {"scalar_tensor", "full", "arange", "zeros", "ones", "empty", "full_like", "zeros_like",
             "ones_like", "empty_like", "lift_fresh_copy", "_tensor_constant", "tensor"}
CASTS = {"_to_copy", "to", "clone", "copy", "type_as", "alias", "_assert_tensor_metadata",
         "contiguous", "detach", "lift_fresh", "_to_dtype"}
ACTIVATIONS = {"relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "hardtanh", "hardswish", "hardsigmoid",
               "leaky_relu", "elu", "selu", "celu", "softplus", "softsign", "mish", "erf", "logsigmoid",
               "threshold", "glu", "prelu", "_prelu_kernel", "rrelu", "tanhshrink", "softshrink",
               "hardshrink", "sigmoid_backward", "clamp", "clamp_min", "clamp_max"}
UNTAGGED_POINTWISE = {"hardswish"}  # pointwise, but ATen does not tag it so
LOGIC = {"eq", "ne", "lt", "le", "gt", "ge", "where", "logical_and", "logical_or", "logical_not",
         "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor", "isnan", "isinf",
         "isfinite", "masked_fill", "any", "all", "sign", "signbit"}
SHAPE = {"cat", "stack", "constant_pad_nd", "pad", "split", "split_with_sizes", "chunk", "flip", "roll",
         "repeat", "repeat_interleave", "index", "index_select", "gather", "scatter", "scatter_add",
         "scatter_reduce", "index_put", "index_add", "index_copy", "embedding", "slice_scatter",
         "select_scatter", "diagonal_scatter", "as_strided_scatter", "masked_scatter", "take", "tril",
         "triu", "nonzero", "unfold", "im2col", "col2im", "reflection_pad1d", "reflection_pad2d",
         "replication_pad2d", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle"}
RESIZE = {"upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d",
          "upsample_bicubic2d", "upsample_linear1d", "upsample_trilinear3d", "_upsample_nearest_exact2d",
          "_upsample_bilinear2d_aa", "grid_sampler_2d", "grid_sampler", "affine_grid_generator"}
SIGNAL = {"_fft_r2c", "_fft_c2r", "_fft_c2c", "fft_fft", "fft_rfft", "fft_irfft", "stft", "istft"}
SEQUENCE = {"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "sort", "argsort", "topk", "kthvalue",
            "searchsorted", "bucketize", "unique", "while_loop", "cond", "scan", "map"}
QUANT = {"quantize_per_tensor", "dequantize", "quantize_per_channel", "fake_quantize_per_tensor_affine",
         "fake_quantize_per_channel_affine", "_fake_quantize_learnable_per_tensor_affine"}


def op_name(target: Any) -> str:
    """Short name of a call_function target: `aten.mul.Tensor` -> "mul", `operator.getitem` -> "getitem"."""
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target.__name__
    return getattr(target, "__name__", str(target))


def qualified_name(target: Any) -> str:
    """Full printable name: "aten.mul.Tensor", "getitem", or module.qualname for other callables."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"{ns}.{target._opname}.{target._overloadname}"
    if target is operator.getitem:
        return "getitem"
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', str(target))}".strip(".")


def kind_of(target: Any) -> Kind:
    """How an op fuses; see the module docstring."""
    if target is operator.getitem:
        return Kind.VIEW
    name = op_name(target)
    if name in MATMUL or name in CONV or name in ATTENTION or name in POOL:
        return Kind.HEAVY
    if name in NORMS or name in SOFTMAX or name in REDUCTIONS_EXTRA:
        return Kind.REDUCE
    if name in FACTORIES:
        return Kind.FACTORY
    if name in CASTS or name in AFFINE_NORMS or name in UNTAGGED_POINTWISE:
        return Kind.POINTWISE
    if name in SHAPE or name in SEQUENCE or name in RESIZE or name in SIGNAL or name in QUANT:
        return Kind.SINGLE
    if isinstance(target, torch._ops.OpOverload):
        if target.is_view:
            return Kind.VIEW
        if torch.Tag.pointwise in target.tags:
            return Kind.POINTWISE
        if torch.Tag.reduction in target.tags:
            return Kind.REDUCE
    return Kind.SINGLE


def family_of_op(target: Any) -> str:
    """The op family of one op (see FAMILIES)."""
    if is_scan(target):
        return "scan"
    name = op_name(target)
    if name in ATTENTION:
        return "attention"
    if name in MATMUL:
        return "matmul"
    if name in CONV or name in POOL:
        return "convolution/pooling"
    if name in NORMS or name in AFFINE_NORMS:
        return "normalization"
    if name in SOFTMAX or name in ACTIVATIONS:
        return "activation"
    if name in QUANT:
        return "quantization"
    if name in SIGNAL:
        return "signal"
    if name in RESIZE:
        return "resize/sampling"
    if name in SEQUENCE:
        return "sequence/control"
    if name in LOGIC:
        return "logic"
    if name in SHAPE or name in CASTS or name in FACTORIES or target is operator.getitem:
        return "shape"
    k = kind_of(target)
    if k is Kind.VIEW:
        return "shape"
    if k is Kind.REDUCE:
        return "reduction"
    if k is Kind.POINTWISE:
        return "arithmetic"
    return "other"


# Ops that make a reduction region a normalization: RMSNorm and LayerNorm written out by hand.
_NORM_MARKERS = {"rsqrt", "sqrt", "var", "var_mean", "std"}


def family_of_region(targets: list[Any], inverse_root: bool = False) -> str:
    """The op family of a region: its heavy op, else its reduction, else its most telling pointwise op.

    `inverse_root` says the region raises something to a negative power (Gemma writes RMSNorm's
    rsqrt as `pow(x, -0.5)`), which makes a reduction region a normalization.
    """
    fams = [family_of_op(t) for t in targets]
    kinds = [kind_of(t) for t in targets]
    names = {op_name(t) for t in targets} | ({"rsqrt"} if inverse_root else set())
    for k, f in zip(kinds, fams, strict=True):
        if k is Kind.HEAVY or k is Kind.SINGLE:
            return f
    for k, f in zip(kinds, fams, strict=True):
        if k is Kind.REDUCE:
            if f == "reduction" and names & _NORM_MARKERS:
                return "normalization"
            return f
    for wanted in ("quantization", "normalization", "activation", "arithmetic", "logic"):
        if wanted in fams:
            return wanted
    return "shape"
