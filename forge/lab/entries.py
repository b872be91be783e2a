"""The lab's entries, family by family (forge.lab.catalogue says what an entry is).

Each function takes the maker's inputs and `p`, the parameter. Functions stay plain PyTorch: forge captures
them and decides whether its recipes write the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812

from forge.lab.catalogue import Entry, Param
from forge.lab.entries_more import MORE


def _u(f: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A one-input function without parameter."""
    return lambda x, p=0.0: f(x)


def _b(f: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A two-input function without parameter."""
    return lambda x, y, p=0.0: f(x, y)


Y = Param("y", 2.0, -10.0, 10.0)  # the second input of a two-input curve

_ARITH = [
    Entry("sin", "arithmetic", "sine", _u(torch.sin), "curve", lo=-2 * math.pi, hi=2 * math.pi),
    Entry("cos", "arithmetic", "cosine", _u(torch.cos), "curve", lo=-2 * math.pi, hi=2 * math.pi),
    Entry("tan", "arithmetic", "tangent", _u(torch.tan), "curve", lo=-1.4, hi=1.4),
    Entry("asin", "arithmetic", "arcsine", _u(torch.asin), "curve", lo=-1.0, hi=1.0),
    Entry("acos", "arithmetic", "arccosine", _u(torch.acos), "curve", lo=-1.0, hi=1.0),
    Entry("atan", "arithmetic", "arctangent", _u(torch.atan), "curve"),
    Entry("sinh", "arithmetic", "hyperbolic sine", _u(torch.sinh), "curve", lo=-3, hi=3),
    Entry("cosh", "arithmetic", "hyperbolic cosine", _u(torch.cosh), "curve", lo=-3, hi=3),
    Entry("asinh", "arithmetic", "inverse hyperbolic sine", _u(torch.asinh), "curve"),
    Entry("exp", "arithmetic", "exponential", _u(torch.exp), "curve", lo=-4, hi=3),
    Entry("exp2", "arithmetic", "power of two", _u(torch.exp2), "curve", lo=-4, hi=3),
    Entry("expm1", "arithmetic", "exp(x) - 1", _u(torch.expm1), "curve", lo=-3, hi=2),
    Entry("log", "arithmetic", "natural logarithm", _u(torch.log), "curve", lo=0.01, hi=8),
    Entry("log2", "arithmetic", "base-2 logarithm", _u(torch.log2), "curve", lo=0.01, hi=8),
    Entry("log10", "arithmetic", "base-10 logarithm", _u(torch.log10), "curve", lo=0.01, hi=8),
    Entry("log1p", "arithmetic", "log(1 + x)", _u(torch.log1p), "curve", lo=-0.9, hi=8),
    Entry("sqrt", "arithmetic", "square root", _u(torch.sqrt), "curve", lo=0.0, hi=8),
    Entry("rsqrt", "arithmetic", "reciprocal square root", _u(torch.rsqrt), "curve", lo=0.05, hi=8),
    Entry("reciprocal", "arithmetic", "reciprocal", _u(torch.reciprocal), "curve", lo=0.1, hi=4),
    Entry("square", "arithmetic", "square", _u(lambda x: x * x), "curve"),
    Entry("cube", "arithmetic", "cube (pow 3)", _u(lambda x: torch.pow(x, 3)), "curve", lo=-2, hi=2),
    Entry("abs", "arithmetic", "absolute value", _u(torch.abs), "curve"),
    Entry("floor", "arithmetic", "floor", _u(torch.floor), "curve"),
    Entry("ceil", "arithmetic", "ceiling", _u(torch.ceil), "curve"),
    Entry("round", "arithmetic", "round half to even", _u(torch.round), "curve"),
    Entry("trunc", "arithmetic", "truncate", _u(torch.trunc), "curve"),
    Entry("add", "arithmetic", "x + y", _b(torch.add), "curve2", Y),
    Entry("mul", "arithmetic", "x * y", _b(torch.mul), "curve2", Y),
    Entry("div", "arithmetic", "x / y", _b(torch.div), "curve2", Y),
    Entry("pow", "arithmetic", "x ** y", _b(torch.pow), "curve2", Param("y", 2.0, 0.0, 4.0), lo=0.0, hi=3.0),
    Entry("atan2", "arithmetic", "atan2(y, x)", _b(lambda x, y: torch.atan2(y, x)), "curve2", Y),
    Entry("hypot", "arithmetic", "hypot(x, y)", _b(torch.hypot), "curve2", Y),
    Entry("maximum", "arithmetic", "max(x, y)", _b(torch.maximum), "curve2", Param("y", 0.5, -4, 4)),
    Entry("minimum", "arithmetic", "min(x, y)", _b(torch.minimum), "curve2", Param("y", 0.5, -4, 4)),
    Entry("fmod", "arithmetic", "fmod(x, y)", _b(torch.fmod), "curve2", Param("y", 1.5, 0.1, 4)),
    Entry("remainder", "arithmetic", "x mod y (Python's)", _b(torch.remainder), "curve2",
          Param("y", 1.5, 0.1, 4)),
    Entry("poly", "arithmetic", "x^3 - 2x + p (Horner)", lambda x, p=0.5: (x * x - 2) * x + p, "curve",
          Param("p", 0.5, -5, 5), lo=-2, hi=2),
]

_ACT = [
    Entry("relu", "activation", "ReLU", _u(F.relu), "curve"),
    Entry("relu6", "activation", "ReLU6", _u(F.relu6), "curve", lo=-2, hi=8),
    Entry("gelu", "activation", "GELU (erf)", _u(F.gelu), "curve"),
    Entry("gelu-tanh", "activation", "GELU (tanh)", _u(lambda x: F.gelu(x, approximate="tanh")), "curve"),
    Entry("silu", "activation", "SiLU / swish", _u(F.silu), "curve"),
    Entry("sigmoid", "activation", "sigmoid", _u(torch.sigmoid), "curve", lo=-8, hi=8),
    Entry("tanh", "activation", "tanh", _u(torch.tanh), "curve"),
    Entry("hardtanh", "activation", "hardtanh", _u(F.hardtanh), "curve"),
    Entry("hardswish", "activation", "hardswish", _u(F.hardswish), "curve"),
    Entry("hardsigmoid", "activation", "hardsigmoid", _u(F.hardsigmoid), "curve"),
    Entry("leaky-relu", "activation", "leaky ReLU", lambda x, p=0.1: F.leaky_relu(x, p), "curve",
          Param("slope", 0.1, 0.0, 1.0)),
    Entry("elu", "activation", "ELU", lambda x, p=1.0: F.elu(x, p), "curve", Param("alpha", 1.0, 0.0, 5.0)),
    Entry("selu", "activation", "SELU", _u(F.selu), "curve"),
    Entry("celu", "activation", "CELU", lambda x, p=1.0: F.celu(x, p), "curve", Param("alpha", 1.0, 0.1, 5.0)),
    Entry("softplus", "activation", "softplus", lambda x, p=1.0: F.softplus(x, p), "curve",
          Param("beta", 1.0, 0.1, 10.0)),
    Entry("softsign", "activation", "softsign", _u(F.softsign), "curve"),
    Entry("mish", "activation", "mish", _u(F.mish), "curve"),
    Entry("logsigmoid", "activation", "log-sigmoid", _u(F.logsigmoid), "curve"),
    Entry("tanhshrink", "activation", "tanhshrink", _u(F.tanhshrink), "curve"),
    Entry("softshrink", "activation", "softshrink", lambda x, p=0.5: F.softshrink(x, p), "curve",
          Param("lambda", 0.5, 0.0, 3.0)),
    Entry("hardshrink", "activation", "hardshrink", lambda x, p=0.5: F.hardshrink(x, p), "curve",
          Param("lambda", 0.5, 0.0, 3.0)),
    Entry("threshold", "activation", "threshold (x > t else 0)", lambda x, p=1.0: F.threshold(x, p, 0.0),
          "curve", Param("t", 1.0, -4, 4)),
    Entry("erf", "activation", "error function", _u(torch.erf), "curve", lo=-3, hi=3),
    Entry("clamp", "activation", "clamp to [-p, p]", lambda x, p=1.5: torch.clamp(x, -p, p), "curve",
          Param("p", 1.5, 0.0, 4.0)),
    Entry("softmax", "activation", "softmax of a ramp", _u(lambda x: torch.softmax(x, -1)), "curve"),
    Entry("log-softmax", "activation", "log-softmax of a ramp", _u(lambda x: torch.log_softmax(x, -1)), "curve"),
]


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


_NORM = [
    Entry("layer-norm-rows", "normalization", "LayerNorm over each image row",
          _u(lambda x: F.layer_norm(x, x.shape[-1:])), "image"),
    Entry("rms-norm-rows", "normalization", "RMSNorm over each image row", _u(_rms), "image"),
    Entry("group-norm-1", "normalization", "GroupNorm, one group (whole image)",
          _u(lambda x: F.group_norm(x, 1)), "image"),
    Entry("group-norm-3", "normalization", "GroupNorm, a group per channel",
          _u(lambda x: F.group_norm(x, 3)), "image"),
    Entry("standardize-rows", "normalization", "(x - mean) / std per row",
          _u(lambda x: (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + 1e-5).sqrt()), "image"),
    Entry("minmax-rows", "normalization", "x / max per row (peak normalization)",
          _u(lambda x: x / (x.amax(-1, keepdim=True) + 1e-6)), "image"),
    Entry("l2-normalize-rows", "normalization", "F.normalize (L2) per row", _u(lambda x: F.normalize(x, dim=-1)),
          "image"),
    Entry("instance-norm", "normalization", "InstanceNorm", _u(F.instance_norm), "image"),
    Entry("batch-norm-eval", "normalization", "BatchNorm with fixed statistics (eval)",
          _u(lambda x: F.batch_norm(x, torch.full((3,), 0.45), torch.full((3,), 0.05), torch.full((3,), 0.2),
                                     torch.full((3,), 0.5), training=False)), "image"),
]

_RED = [
    Entry("sum-rows", "reduction", "sum of each row", _u(lambda x: x.sum(-1)), "rows"),
    Entry("mean-rows", "reduction", "mean of each row", _u(lambda x: x.mean(-1)), "rows"),
    Entry("max-rows", "reduction", "max of each row", _u(lambda x: x.amax(-1)), "rows"),
    Entry("min-rows", "reduction", "min of each row", _u(lambda x: x.amin(-1)), "rows"),
    Entry("var-rows", "reduction", "variance of each row", _u(lambda x: x.var(-1)), "rows"),
    Entry("std-rows", "reduction", "standard deviation of each row", _u(lambda x: x.var(-1).sqrt()), "rows"),
    Entry("logsumexp-rows", "reduction", "log-sum-exp of each row", _u(lambda x: torch.logsumexp(x, -1)), "rows"),
    Entry("l2-rows", "reduction", "L2 norm of each row (sqrt of sum of squares)",
          _u(lambda x: (x * x).sum(-1).sqrt()), "rows"),
    Entry("mean-abs-rows", "reduction", "mean absolute value of each row", _u(lambda x: x.abs().mean(-1)), "rows"),
    Entry("rms-rows", "reduction", "root mean square of each row", _u(lambda x: (x * x).mean(-1).sqrt()), "rows"),
    Entry("argmax-rows", "reduction", "argmax of each row", _u(lambda x: x.argmax(-1).float()), "rows"),
    Entry("median-rows", "reduction", "median of each row", _u(lambda x: x.median(-1).values), "rows"),
    Entry("prod-rows", "reduction", "product of each row of (1 + x/100)",
          _u(lambda x: (1 + x / 100).prod(-1)), "rows"),
]

_LOGIC = [
    Entry("greater", "logic", "x > t", lambda x, y, p=0.5: x > p, "gray", Param("t", 0.5, 0, 1)),
    Entry("less", "logic", "x < t", lambda x, y, p=0.3: x < p, "gray", Param("t", 0.3, 0, 1)),
    Entry("near", "logic", "|x - mirror(x)| < t", lambda x, y, p=0.05: (x - y).abs() < p, "gray",
          Param("t", 0.05, 0, 1)),
    Entry("where", "logic", "where(x > t, x, 0)", lambda x, y, p=0.5: torch.where(x > p, x, 0.0), "gray",
          Param("t", 0.5, 0, 1), picture="image"),
    Entry("and", "logic", "x > t and mirror > t", lambda x, y, p=0.5: (x > p) & (y > p), "gray",
          Param("t", 0.5, 0, 1)),
    Entry("or", "logic", "x > t or mirror > t", lambda x, y, p=0.7: (x > p) | (y > p), "gray",
          Param("t", 0.7, 0, 1)),
    Entry("xor", "logic", "x > t xor mirror > t", lambda x, y, p=0.5: (x > p) ^ (y > p), "gray",
          Param("t", 0.5, 0, 1)),
    Entry("not", "logic", "not (x > t)", lambda x, y, p=0.5: ~(x > p), "gray", Param("t", 0.5, 0, 1)),
    Entry("equal-levels", "logic", "round(4x) == round(4 mirror)",
          _b(lambda x, y: torch.round(x * 4) == torch.round(y * 4)), "gray"),
    Entry("sign", "logic", "sign(x - mirror)", _b(lambda x, y: torch.sign(x - y) * 0.5 + 0.5), "gray",
          picture="image"),
    Entry("max-mask", "logic", "x is the brighter of the two", _b(lambda x, y: x >= y), "gray"),
]

ENTRIES: list[Entry] = _ARITH + _ACT + _NORM + _RED + _LOGIC + MORE
