"""Recipe: pointwise regions (chains with broadcasting, views and casts) -> one C loop for the CPU.

The task's reference source is traced (make_fx, meta tensors) back into an ATen graph. Every value is
evaluated at a flat row-major index of its own shape: views keep the index, `expand` and broadcasting
map it to the operand's smaller shape, `permute` remaps it, inputs are loaded through their real
strides. All arithmetic is in float (double for float64 tasks) and each output is rounded once to its
dtype. Tasks it cannot express (reductions, gathers, integer math, slices) get `NotMine` with the reason.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from forge.capture import TensorMeta, contiguous_stride
from forge.kernel import Candidate, TaskSpec
from forge.ops import Kind, kind_of, op_name
from forge.recipes.index import Expr, IndexError_, Simplifier, cexpr, flatten, unflatten, unit_stride_in, var
from forge.tasks import compile_source


class NotMine(Exception):
    """The recipe cannot express this task (the message says why)."""


@dataclass(frozen=True)
class Knobs:
    """The schedule the search explores."""

    chunk: int = 0  # OpenMP static schedule chunk (0: even split)
    simd: bool = True  # `omp parallel for simd`
    unroll: int = 1  # GCC unroll pragma
    fast_math: bool = False


_VIEWS = {"view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "alias", "clone", "contiguous",
          "lift_fresh_copy", "detach"}
_FLOAT_TYPES = {torch.float32: "float", torch.float16: "forge_half", torch.bfloat16: "uint16_t",
                torch.float64: "double", torch.bool: "uint8_t", torch.uint8: "uint8_t"}

_UNARY = {
    "exp": "forge_expf({a})", "log": "logf({a})", "sqrt": "sqrtf({a})", "rsqrt": "(1.0f / sqrtf({a}))",
    "sigmoid": "forge_sigmoidf({a})", "tanh": "forge_tanhf({a})", "neg": "(-{a})", "abs": "fabsf({a})",
    "relu": "({a} > 0.0f ? {a} : 0.0f)", "erf": "erff({a})", "log1p": "log1pf({a})", "expm1": "expm1f({a})",
    "reciprocal": "(1.0f / {a})", "sin": "sinf({a})", "cos": "cosf({a})", "silu": "({a} * forge_sigmoidf({a}))",
    "logical_not": "({a} == 0.0f ? 1.0f : 0.0f)", "bitwise_not": "({a} == 0.0f ? 1.0f : 0.0f)",
    "floor": "floorf({a})", "ceil": "ceilf({a})", "sign": "(({a} > 0.0f) - ({a} < 0.0f))",
    "exp2": "exp2f({a})", "log2": "log2f({a})", "isnan": "({a} != {a} ? 1.0f : 0.0f)",
}
_BINARY = {"mul": "({a} * {b})", "div": "({a} / {b})", "maximum": "fmaxf({a}, {b})",
           "minimum": "fminf({a}, {b})", "pow": "powf({a}, {b})", "atan2": "atan2f({a}, {b})",
           "eq": "({a} == {b} ? 1.0f : 0.0f)", "ne": "({a} != {b} ? 1.0f : 0.0f)",
           "lt": "({a} < {b} ? 1.0f : 0.0f)", "le": "({a} <= {b} ? 1.0f : 0.0f)",
           "gt": "({a} > {b} ? 1.0f : 0.0f)", "ge": "({a} >= {b} ? 1.0f : 0.0f)",
           "logical_and": "(({a} != 0.0f && {b} != 0.0f) ? 1.0f : 0.0f)",
           "logical_or": "(({a} != 0.0f || {b} != 0.0f) ? 1.0f : 0.0f)",
           "bitwise_and": "(({a} != 0.0f && {b} != 0.0f) ? 1.0f : 0.0f)",
           "bitwise_or": "(({a} != 0.0f || {b} != 0.0f) ? 1.0f : 0.0f)"}

PRELUDE = r"""#include "forge_abi.h"
#include <math.h>
#include <string.h>
static inline float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16);
}
static inline float round_bf16(float f) { return bf2f(f2bf(f)); }
typedef _Float16 forge_half;
static inline float h2f(forge_half h) { return (float)h; }
static inline forge_half f2h(float f) { return (forge_half)f; }
static inline float round_f16(float f) { return (float)(forge_half)f; }
// exp in plain arithmetic, so loops that use it vectorise (libm's expf does not: errno, no vector
// variant). Cephes' range reduction and polynomial, about 2 ulp; inputs clamped to the float range.
static inline float forge_expf(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.72f ? 88.72f : x);
#ifdef __FAST_MATH__  // reassociation would cancel the magic-number rounding below
  const float y = x * 1.44269504088896341f;
  const float n = (float)(int32_t)(y + (y >= 0.0f ? 0.5f : -0.5f));
#else  // round to nearest by adding and subtracting 1.5 * 2^23 (vectorises without fast math)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
#endif
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return 2.0f * p * __builtin_bit_cast(float, ((int32_t)n + 126) << 23);  // n = 128 stays finite
}
// Saturating forms: arguments kept where exp stays finite, since fast math's reciprocal (with a Newton
// step) turns 1/inf into NaN.
static inline float forge_tanhf(float x) {
  x = x < -9.0f ? -9.0f : (x > 9.0f ? 9.0f : x);  // tanh is +-1 in float beyond
  return 1.0f - 2.0f / (forge_expf(2.0f * x) + 1.0f);
}
static inline float forge_sigmoidf(float x) { return 1.0f / (1.0f + forge_expf(x < -88.0f ? 88.0f : -x)); }
static inline float forge_max(float a, float b) { return a > b ? a : b; }
static inline float forge_min(float a, float b) { return a < b ? a : b; }
"""


def _lit(x: Any) -> str:
    if isinstance(x, bool):
        return "1.0f" if x else "0.0f"
    if isinstance(x, (int, float)):
        if math.isinf(x):
            return "INFINITY" if x > 0 else "(-INFINITY)"
        if math.isnan(x):
            return "NAN"
        return f"{float(x)!r}f"
    raise NotMine(f"unsupported scalar argument {x!r}")


def _shape(n: torch.fx.Node) -> tuple[int, ...]:
    return tuple(int(s) for s in n.meta["val"].shape)


def to_float(raw: str, dtype: torch.dtype) -> str:
    """A stored element as float."""
    return {torch.bfloat16: f"bf2f({raw})", torch.float16: f"h2f({raw})"}.get(dtype, f"(float){raw}")


def from_float(v: str, dtype: torch.dtype) -> str:
    """A float value as an element of `dtype` (rounded once)."""
    return {torch.bfloat16: f"f2bf({v})", torch.float16: f"f2h({v})", torch.bool: f"(uint8_t)({v} != 0.0f)"}.get(
        dtype, f"({_FLOAT_TYPES[dtype]})({v})")


class _Emitter:
    """Turns the traced graph into statements of one loop body, memoised per (node, index).

    Indices are sympy expressions in the loop variables (forge.recipes.index); input loads are
    simplified with the loop ranges and recorded in `loads`.
    """

    def __init__(self, inputs: dict[torch.fx.Node, int], metas: tuple[TensorMeta, ...], simplify: Simplifier,
                 prefix: str = "t", special: dict[torch.fx.Node, Any] | None = None) -> None:
        self.inputs, self.metas, self.prefix, self.simplify = inputs, metas, prefix, simplify
        self.special = special or {}  # node -> function(idx) giving its expression (a reduction's result)
        self.lines: list[str] = []
        self.memo: dict[tuple[torch.fx.Node, Expr], str] = {}
        self.loads: list[Expr] = []
        self.load_hook: Any = None  # (input index, offset) -> raw element expression, or None: a plain load

    def value(self, node: Any, idx: Expr) -> str:
        """A C expression for `node` at flat index `idx` of the node's own shape."""
        if not isinstance(node, torch.fx.Node):
            return _lit(node)
        if node in self.special:
            return self.special[node](idx)
        idx = self.simplify(idx)
        key = (node, idx)
        if key not in self.memo:
            expr = self._compute(node, idx)
            name = f"{self.prefix}{len(self.memo)}"
            self.lines.append(f"const float {name} = {expr};")
            self.memo[key] = name
        return self.memo[key]

    def _operand(self, node: Any, idx: Expr, out_shape: tuple[int, ...]) -> str:
        """`node` broadcast (right-aligned) to `out_shape`, at flat index `idx` of that shape."""
        if not isinstance(node, torch.fx.Node):
            return _lit(node)
        shape = _shape(node)
        if shape == out_shape:
            return self.value(node, idx)
        if math.prod(shape) == 1:
            return self.value(node, sympy.Integer(0))
        dims = unflatten(idx, out_shape)[len(out_shape) - len(shape):]
        return self.value(node, flatten(dims, shape))

    def _compute(self, n: torch.fx.Node, idx: Expr) -> str:
        if n.op == "placeholder":
            i = self.inputs[n]
            m = self.metas[i]
            off = idx if m.stride == contiguous_stride(m.shape) else flatten(unflatten(idx, m.shape), m.shape,
                                                                               m.stride)
            off = self.simplify(off)
            self.loads.append(off)
            try:
                raw = self.load_hook(i, off) if self.load_hook else None
                raw = raw or f"in{i}_p[{cexpr(off)}]"  # restrict pointers declared once per kernel (pointers())
            except IndexError_ as e:
                raise NotMine(str(e)) from e
            return to_float(raw, m.torch_dtype)
        name = n.target.overloadpacket.__name__ if isinstance(n.target, torch._ops.OpOverload) else ""
        args, kw = n.args, n.kwargs
        if n.target is operator.getitem:
            if args[1] != 0:
                raise NotMine("uses a secondary output of a multi-output op")
            return self.value(args[0], idx)
        out = _shape(n) if isinstance(n.meta["val"], torch.Tensor) else _shape(args[0])  # tuple: first input
        if name in _VIEWS:
            return self.value(args[0], idx)
        if name == "expand":
            return self._operand(args[0], idx, out)
        if name == "permute":
            src = _shape(args[0])
            dims = unflatten(idx, out)
            pos = [0] * len(src)
            for o, p in enumerate(args[1]):
                pos[p % len(src)] = o
            return self.value(args[0], flatten([dims[pos[d]] for d in range(len(src))], src))
        if name in ("slice", "select"):
            src = _shape(args[0])
            dim = args[1] % len(src)
            dims = unflatten(idx, out)
            if name == "select":
                dims.insert(dim, sympy.Integer(args[2] % src[dim]))
            else:
                start = 0 if len(args) < 3 or args[2] is None else args[2]
                start = start + src[dim] if start < 0 else min(start, src[dim])
                step = args[4] if len(args) > 4 else 1
                dims[dim] = start + dims[dim] * step
            return self.value(args[0], flatten(dims, src))
        if name in ("scalar_tensor", "full"):
            return _lit(args[0] if name == "scalar_tensor" else args[1])
        if name == "_to_copy":
            dtype = kw.get("dtype")
            a = self.value(args[0], idx)
            if dtype == torch.bfloat16:
                return f"round_bf16({a})"
            if dtype == torch.float16:
                return f"round_f16({a})"
            if dtype == torch.bool:
                return f"({a} != 0.0f ? 1.0f : 0.0f)"
            if dtype in (torch.float32, torch.float64, None):
                return a
            raise NotMine(f"casts to {dtype}")
        if name in ("add", "sub", "rsub"):
            a, b = (self._operand(x, idx, out) for x in args[:2])
            alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
            b = b if alpha == 1 else f"({_lit(alpha)} * {b})"
            return {"add": f"({a} + {b})", "sub": f"({a} - {b})", "rsub": f"({b} - {a})"}[name]
        if name in _BINARY:
            if name == "div" and kw.get("rounding_mode"):
                raise NotMine("integer division")
            if name == "pow" and not isinstance(args[1], torch.fx.Node):
                return self._power(self.value(args[0], idx), float(args[1]))
            a, b = (self._operand(x, idx, out) for x in args[:2])
            return _BINARY[name].format(a=a, b=b)
        if name == "where":
            c, a, b = (self._operand(x, idx, out) for x in args[:3])
            return f"({c} != 0.0f ? {a} : {b})"
        if name in _UNARY:
            return _UNARY[name].format(a=self.value(args[0], idx))
        return self._special(n, name, idx, out)

    def _power(self, a: str, e: float) -> str:
        return {2.0: f"({a} * {a})", 3.0: f"({a} * {a} * {a})", 1.0: a, 0.5: f"sqrtf({a})",
                -0.5: f"(1.0f / sqrtf({a}))", -1.0: f"(1.0f / {a})"}.get(e, f"powf({a}, {_lit(e)})")

    def _special(self, n: torch.fx.Node, name: str, idx: Expr, out: tuple[int, ...]) -> str:
        args, kw = n.args, n.kwargs
        if name == "gelu":
            a = self.value(args[0], idx)
            if kw.get("approximate", "none") == "tanh":
                return (f"(0.5f * {a} * (1.0f + forge_tanhf(0.7978845608028654f * ({a} + 0.044715f * {a} * {a} * "
                        f"{a}))))")
            return f"(0.5f * {a} * (1.0f + erff({a} * 0.7071067811865476f)))"
        if name in ("clamp", "hardtanh", "clamp_min", "clamp_max"):
            a = self.value(args[0], idx)
            lo = args[1] if name != "clamp_max" else None
            hi = (args[2] if len(args) > 2 else kw.get("max")) if name in ("clamp", "hardtanh") else \
                (args[1] if name == "clamp_max" else None)
            if name == "hardtanh":
                lo, hi = (args[1] if len(args) > 1 else -1.0), (args[2] if len(args) > 2 else 1.0)
            if isinstance(lo, torch.fx.Node) or isinstance(hi, torch.fx.Node):
                raise NotMine("tensor clamp bounds")
            expr = a if lo is None else f"forge_max({a}, {_lit(lo)})"
            return expr if hi is None else f"forge_min({expr}, {_lit(hi)})"
        if name == "leaky_relu":
            a = self.value(args[0], idx)
            return f"({a} > 0.0f ? {a} : {_lit(args[1] if len(args) > 1 else 0.01)} * {a})"
        if name == "_native_batch_norm_legit_no_training":
            x, w, b, mean, var = args[:5]
            eps = args[6]
            c = unflatten(idx, out)[1] if len(out) > 1 else sympy.Integer(0)
            xv = self.value(x, idx)
            mv, vv = self.value(mean, c), self.value(var, c)
            wv = self.value(w, c) if w is not None else "1.0f"
            bv = self.value(b, c) if b is not None else "0.0f"
            return f"(({xv} - {mv}) * (1.0f / sqrtf({vv} + {_lit(eps)})) * {wv} + {bv})"
        raise NotMine(f"no recipe for aten.{name}")


def trace_task(spec: TaskSpec) -> torch.fx.GraphModule:
    """The task's reference traced back to an ATen graph on meta tensors; NotMine if it cannot be."""
    fake = [torch.empty_strided(m.shape, m.stride, dtype=m.torch_dtype, device="meta") for m in spec.inputs]
    fn = compile_source(spec.source)
    try:
        return make_fx(lambda *args: fn(*args))(*fake)  # the lambda hides region's optional `device`
    except Exception as e:
        raise NotMine(f"cannot trace the task: {type(e).__name__}: {str(e)[:100]}") from e


@dataclass(frozen=True)
class Lowered:
    """A task the pointwise recipe can express: its C loop body and output stores.

    The loop is split in two: `outer` iterations (variable `o`, parallel) of `inner` elements (variable
    `k`, the vector loop), flat index `o * inner + k`; `inner` is the longest trailing block in which every
    input is read at unit stride or not at all (all of it, `outer` == 1, when no such block exists).
    """

    body: tuple[str, ...]
    numel: int
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    outer: int = 1
    inner: int = 0


def lower(spec: TaskSpec) -> Lowered:
    """Trace the task and express it as one loop nest; raises NotMine when it cannot."""
    for m in spec.inputs + spec.outputs:
        if m.torch_dtype not in _FLOAT_TYPES:
            raise NotMine(f"integer tensors ({m.dtype})")
    if not spec.outputs:
        raise NotMine("no outputs")
    numel = spec.outputs[0].numel
    for m in spec.outputs:
        if m.numel != numel:
            raise NotMine("outputs of different sizes")
    gm = trace_task(spec)
    for n in gm.graph.nodes:
        if n.op == "call_function" and kind_of(n.target) in (Kind.REDUCE, Kind.HEAVY, Kind.SINGLE):
            what = "a reduction or normalization" if kind_of(n.target) is Kind.REDUCE else f"aten.{op_name(n.target)}"
            raise NotMine(f"has {what}: not a pointwise region")
    shape = spec.outputs[0].shape
    suffixes = sorted({math.prod(shape[d:]) for d in range(len(shape))} - {numel, 1}, reverse=True)
    flat = None
    for inner in [numel, *[s for s in suffixes if s >= 16]]:
        low = _lower_split(gm, spec, numel, inner)
        o, k = var("o"), var("k")
        if inner == numel and all(unit_stride_in(e.subs(o, 0), k) for e in low[1]):
            return low[0]
        if inner < numel and all(unit_stride_in(e, k) for e in low[1]):
            return low[0]
        flat = flat or low[0]
    assert flat is not None
    return flat


def _lower_split(gm: torch.fx.GraphModule, spec: TaskSpec, numel: int, inner: int) -> tuple[Lowered, list[Expr]]:
    o, k = var("o"), var("k")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    em = _Emitter({p: i for i, p in enumerate(placeholders)}, spec.inputs,
                  Simplifier({o: max(numel // inner, 1), k: inner}))
    i = o * inner + k
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    stores = []
    for j, (node, m) in enumerate(zip(out_node.args[0], spec.outputs, strict=True)):
        v = em.value(node, i)
        stores.append(f"out{j}_p[i] = {from_float(v, m.torch_dtype)};")
    return Lowered(tuple(em.lines + stores), numel, spec.inputs, spec.outputs, numel // inner, inner), em.loads


def index_type(numel: int) -> str:
    """`idx_t`: 32-bit when the indices fit, so index arithmetic and gathers vectorise."""
    return f"  typedef {'int32_t' if numel < 2**31 else 'int64_t'} idx_t;\n"


def pointers(inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...]) -> str:
    """Declarations of restrict-qualified data pointers, so loops vectorise without alias checks."""
    lines = [f"  const {_FLOAT_TYPES[m.torch_dtype]}* __restrict__ in{i}_p = "
             f"(const {_FLOAT_TYPES[m.torch_dtype]}*)in[{i}].data;" for i, m in enumerate(inputs)]
    lines += [f"  {_FLOAT_TYPES[m.torch_dtype]}* __restrict__ out{j}_p = ({_FLOAT_TYPES[m.torch_dtype]}*)out[{j}].data;"
              for j, m in enumerate(outputs)]
    return "\n".join(lines) + "\n"


def emit_cpu(low: Lowered, knobs: Knobs) -> str:
    """The C++ source of the loop nest with these knobs."""
    checks = [f"in[{i}].ndim != {len(m.shape)}" for i, m in enumerate(low.inputs)]
    checks += [f"in[{i}].shape[{d}] != {s}" for i, m in enumerate(low.inputs) for d, s in enumerate(m.shape)]
    checks += [f"in[{i}].stride[{d}] != {s}" for i, m in enumerate(low.inputs) for d, s in enumerate(m.stride)
               if m.shape[d] > 1]
    schedule = f" schedule(static, {knobs.chunk})" if knobs.chunk else " schedule(static)"
    guard = " || ".join(checks) or "0"
    simd = "#pragma omp simd" if knobs.simd else f"#pragma GCC unroll {max(knobs.unroll, 1)}"
    if low.outer > 1:  # rows of unit-stride elements: parallel over rows, vector loop inside
        body = "\n".join(f"      {line}" for line in low.body)
        loop = (f"  #pragma omp parallel for{schedule}\n  for (idx_t o = 0; o < {low.outer}; ++o) {{\n"
                f"    {simd}\n    for (idx_t k = 0; k < {low.inner}; ++k) {{\n"
                f"      const idx_t i = o * {low.inner} + k;\n"
                f"{body}\n    }}\n  }}\n")
    elif knobs.unroll > 1:  # blocks of `unroll` elements per iteration of the parallel loop, the tail cut short
        body = "\n".join(f"      {line}" for line in low.body)
        loop = (f"  #pragma omp parallel for{schedule}\n"
                f"  for (idx_t i0 = 0; i0 < n; i0 += {knobs.unroll}) {{\n"
                f"    const idx_t end = i0 + {knobs.unroll} < n ? i0 + {knobs.unroll} : n;\n"
                f"    {simd}\n    for (idx_t k = i0; k < end; ++k) {{\n      const idx_t o = 0, i = k; (void)o;\n"
                f"{body}\n    }}\n  }}\n")
    else:
        body = "\n".join(f"    {line}" for line in low.body)
        loop = (f"  #pragma omp parallel for{' simd' if knobs.simd else ''}{schedule}\n"
                f"  for (idx_t k = 0; k < n; ++k) {{\n    const idx_t o = 0, i = k; (void)o;\n{body}\n  }}\n")
    return (f"{PRELUDE}\n// forge recipe: pointwise, {low.outer} x {low.inner}, knobs {knobs}\n"
            f"extern \"C\" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {{\n"
            f"  if (n_in != {len(low.inputs)} || n_out != {len(low.outputs)}) return 1;\n"
            f"  if ({guard}) return 2;\n{pointers(low.inputs, low.outputs)}"
            f"{index_type(low.numel)}  const idx_t n = {low.numel}; (void)n;\n{loop}  return 0;\n}}\n")


def candidate(low: Lowered, knobs: Knobs) -> Candidate:
    """A cpu Candidate for these knobs (fast math is a compiler flag)."""
    flags = ("-ffast-math",) if knobs.fast_math else ("-fno-math-errno",)  # errno blocks vector sqrt/log
    return Candidate("cpu", emit_cpu(low, knobs), flags=flags)
