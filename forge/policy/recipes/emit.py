"""Graph to C expressions: the lowering every recipe shares (CPU C and CUDA alike).

The task's reference source is traced (make_fx, meta tensors) back into an ATen graph. Every value is
evaluated at a symbolic flat index of its own shape (forge.policy.recipes.index): views keep the index, `expand`
and broadcasting map it to the operand's smaller shape, `permute`, `slice` and `select` remap it, inputs
are loaded through their real strides. All arithmetic is in float (double for float64 tasks) and each
output is rounded once to its dtype. What cannot be expressed raises `NotMine` with the reason.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from forge.capture.export import TensorMeta, contiguous_stride
from forge.kernel import TaskSpec
from forge.policy.recipes.index import Expr, Simplifier, UnprintableIndex, cexpr, flatten, unflatten
from forge.tasks.cut import compile_source


class NotMine(Exception):
    """The recipe cannot express this task (the message says why)."""


VIEWS = {"view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "alias", "clone", "contiguous",
          "lift_fresh_copy", "detach"}
FLOAT_TYPES = {torch.float32: "float", torch.float16: "forge_half", torch.bfloat16: "uint16_t",
                torch.float64: "double", torch.bool: "uint8_t", torch.uint8: "uint8_t"}

_UNARY = {
    "exp": "forge_expf({a})", "log": "logf({a})", "sqrt": "sqrtf({a})", "rsqrt": "(1.0f / sqrtf({a}))",
    "sigmoid": "forge_sigmoidf({a})", "tanh": "forge_tanhf({a})", "neg": "(-{a})", "abs": "fabsf({a})",
    "relu": "({a} > 0.0f ? {a} : 0.0f)", "erf": "erff({a})", "log1p": "log1pf({a})", "expm1": "expm1f({a})",
    "reciprocal": "(1.0f / {a})", "sin": "sinf({a})", "cos": "cosf({a})", "silu": "({a} * forge_sigmoidf({a}))",
    "logical_not": "({a} == 0.0f ? 1.0f : 0.0f)", "bitwise_not": "({a} == 0.0f ? 1.0f : 0.0f)",
    "floor": "floorf({a})", "ceil": "ceilf({a})", "sign": "(({a} > 0.0f) - ({a} < 0.0f))",
    "exp2": "exp2f({a})", "log2": "log2f({a})", "isnan": "({a} != {a} ? 1.0f : 0.0f)",
    # kept whole by forge.capture.export (one kernel each in eager), in eager's own arithmetic
    "hardsigmoid": "(forge_min(forge_max({a} + 3.0f, 0.0f), 6.0f) / 6.0f)",
    "hardswish": "({a} * forge_min(forge_max({a} + 3.0f, 0.0f), 6.0f) / 6.0f)",
    "mish": "({a} * forge_tanhf(log1pf(forge_expf({a}))))",
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
# The C forms of the other ops the emitter writes (the Triton emitter has its own).
_FORMS = {
    "one": "1.0f", "zero": "0.0f", "select": "({c} != 0.0f ? {a} : {b})",
    "max": "forge_max({a}, {b})", "min": "forge_min({a}, {b})", "leaky": "({a} > 0.0f ? {a} : {s} * {a})",
    "gelu": "(0.5f * {a} * (1.0f + erff({a} * 0.7071067811865476f)))",
    "gelu_tanh": "(0.5f * {a} * (1.0f + forge_tanhf(0.7978845608028654f * ({a} + 0.044715f * {a} * {a} * {a}))))",
    "round_bf16": "round_bf16({a})", "round_f16": "round_f16({a})", "to_bool": "({a} != 0.0f ? 1.0f : 0.0f)",
    "exp": "forge_expf({a})", "log": "logf({a})",
}


def lit(x: Any) -> str:
    if isinstance(x, bool):
        return "1.0f" if x else "0.0f"
    if isinstance(x, (int, float)):
        if math.isinf(x):
            return "INFINITY" if x > 0 else "(-INFINITY)"
        if math.isnan(x):
            return "NAN"
        return f"{float(x)!r}f"
    raise NotMine(f"unsupported scalar argument {x!r}")


def shape_of(n: torch.fx.Node) -> tuple[int, ...]:
    return tuple(int(s) for s in n.meta["val"].shape)


def to_float(raw: str, dtype: torch.dtype) -> str:
    """A stored element as float."""
    return {torch.bfloat16: f"bf2f({raw})", torch.float16: f"h2f({raw})"}.get(dtype, f"(float){raw}")


def from_float(v: str, dtype: torch.dtype) -> str:
    """A float value as an element of `dtype` (rounded once)."""
    return {torch.bfloat16: f"f2bf({v})", torch.float16: f"f2h({v})", torch.bool: f"(uint8_t)({v} != 0.0f)"}.get(
        dtype, f"({FLOAT_TYPES[dtype]})({v})")


class Emitter:
    """Turns the traced graph into statements of one loop body, memoised per (node, index).

    Indices are sympy expressions in the loop variables (forge.policy.recipes.index); input loads are
    simplified with the loop ranges and recorded in `loads`. The language is the class's: its tables (UNARY,
    BINARY, FORMS) and hooks (`lit`, `declare`, `raw_load`, `as_float`, `power`) write C; a subclass writes another
    (forge.policy.recipes.triton_emit: Triton).
    """

    UNARY = _UNARY
    BINARY = _BINARY
    FORMS = _FORMS

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
            return self.lit(node)
        if node in self.special:
            return self.special[node](idx)
        idx = self.simplify(idx)
        key = (node, idx)
        if key not in self.memo:
            expr = self._compute(node, idx)
            name = f"{self.prefix}{len(self.memo)}"
            self.lines.append(self.declare(name, expr))
            self.memo[key] = name
        return self.memo[key]

    def _operand(self, node: Any, idx: Expr, out_shape: tuple[int, ...]) -> str:
        """`node` broadcast (right-aligned) to `out_shape`, at flat index `idx` of that shape."""
        if not isinstance(node, torch.fx.Node):
            return self.lit(node)
        shape = shape_of(node)
        if shape == out_shape:
            return self.value(node, idx)
        if math.prod(shape) == 1:
            return self.value(node, sympy.Integer(0))
        dims = unflatten(idx, out_shape)[len(out_shape) - len(shape):]
        return self.value(node, flatten(dims, shape))

    def _compute(self, n: torch.fx.Node, idx: Expr) -> str:
        """A C expression for `n` at flat index `idx` (the statements of its operands emitted first)."""
        if n.op == "placeholder":
            return self._load(n, idx)
        name = n.target.overloadpacket.__name__ if isinstance(n.target, torch._ops.OpOverload) else ""
        args = n.args
        if n.target is operator.getitem:
            if args[1] != 0:
                raise NotMine("uses a secondary output of a multi-output op")
            return self.value(args[0], idx)
        out = shape_of(n) if isinstance(n.meta["val"], torch.Tensor) else shape_of(args[0])  # tuple: first input
        if name in VIEWS:
            return self.value(args[0], idx)
        if name == "expand":
            return self._operand(args[0], idx, out)
        if name in ("permute", "slice", "select"):
            return self._remap(n, name, idx, out)
        if name in ("scalar_tensor", "full"):
            return self.lit(args[0] if name == "scalar_tensor" else args[1])
        if name == "_to_copy":
            return self._cast(n, idx)
        if name in ("add", "sub", "rsub", "where") or name in self.BINARY:
            return self._arithmetic(n, name, idx, out)
        if name in self.UNARY:
            return self.UNARY[name].format(a=self.value(args[0], idx))
        return self._special(n, name, idx, out)

    def _load(self, n: torch.fx.Node, idx: Expr) -> str:
        """Input `n` at `idx`, loaded through its strides (or by the load hook) as float; the offset recorded."""
        i = self.inputs[n]
        m = self.metas[i]
        off = idx if m.stride == contiguous_stride(m.shape) else flatten(unflatten(idx, m.shape), m.shape,
                                                                           m.stride)
        off = self.simplify(off)
        self.loads.append(off)
        try:
            raw = self.load_hook(i, off) if self.load_hook else None
            raw = raw or self.raw_load(i, off)
        except UnprintableIndex as e:
            raise NotMine(str(e)) from e
        return self.as_float(raw, m.torch_dtype)

    # -- the language: C (a subclass overrides these and the tables) -------------------------------------------
    def lit(self, x: Any) -> str:
        """A scalar constant."""
        return lit(x)

    def declare(self, name: str, expr: str) -> str:
        """The statement binding a value's name."""
        return f"const float {name} = {expr};"

    def raw_load(self, i: int, off: Expr) -> str:
        """The stored element of input `i` at offset `off` (restrict pointers declared once per kernel)."""
        return f"in{i}_p[{cexpr(off)}]"

    def as_float(self, raw: str, dtype: torch.dtype) -> str:
        """A stored element as the arithmetic's float."""
        return to_float(raw, dtype)

    def _remap(self, n: torch.fx.Node, name: str, idx: Expr, out: tuple[int, ...]) -> str:
        """`permute`, `slice` or `select`: the operand at the index of its own shape that `idx` maps to."""
        args = n.args
        if name == "permute":
            src = shape_of(args[0])
            dims = unflatten(idx, out)
            pos = [0] * len(src)
            for o, p in enumerate(args[1]):
                pos[p % len(src)] = o
            return self.value(args[0], flatten([dims[pos[d]] for d in range(len(src))], src))
        src = shape_of(args[0])
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

    def _cast(self, n: torch.fx.Node, idx: Expr) -> str:
        """`_to_copy`: the operand rounded to the dtype cast to (float and double: as it is)."""
        dtype = n.kwargs.get("dtype")
        a = self.value(n.args[0], idx)
        if dtype == torch.bfloat16:
            return self.FORMS["round_bf16"].format(a=a)
        if dtype == torch.float16:
            return self.FORMS["round_f16"].format(a=a)
        if dtype == torch.bool:
            return self.FORMS["to_bool"].format(a=a)
        if dtype in (torch.float32, torch.float64, None):
            return a
        raise NotMine(f"casts to {dtype}")

    def _arithmetic(self, n: torch.fx.Node, name: str, idx: Expr, out: tuple[int, ...]) -> str:
        """`add`, `sub`, `rsub`, `where` or a binary op of _BINARY, its operands broadcast to `out`."""
        args, kw = n.args, n.kwargs
        if name in ("add", "sub", "rsub"):
            a, b = (self._operand(x, idx, out) for x in args[:2])
            alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
            b = b if alpha == 1 else f"({self.lit(alpha)} * {b})"
            return {"add": f"({a} + {b})", "sub": f"({a} - {b})", "rsub": f"({b} - {a})"}[name]
        if name == "where":
            c, a, b = (self._operand(x, idx, out) for x in args[:3])
            return self.FORMS["select"].format(c=c, a=a, b=b)
        if name == "div" and kw.get("rounding_mode"):
            raise NotMine("integer division")
        if name == "pow" and not isinstance(args[1], torch.fx.Node):
            return self.power(self.value(args[0], idx), float(args[1]))
        a, b = (self._operand(x, idx, out) for x in args[:2])
        return self.BINARY[name].format(a=a, b=b)

    def power(self, a: str, e: float) -> str:
        """`a` to a constant power."""
        one = self.FORMS["one"]
        return {2.0: f"({a} * {a})", 3.0: f"({a} * {a} * {a})", 1.0: a, 0.5: self.UNARY["sqrt"].format(a=a),
                -0.5: f"({one} / {self.UNARY['sqrt'].format(a=a)})", -1.0: f"({one} / {a})"
                }.get(e) or self.BINARY["pow"].format(a=a, b=self.lit(e))

    def _special(self, n: torch.fx.Node, name: str, idx: Expr, out: tuple[int, ...]) -> str:
        args, kw = n.args, n.kwargs
        if name == "gelu":
            a = self.value(args[0], idx)
            form = "gelu_tanh" if kw.get("approximate", "none") == "tanh" else "gelu"
            return self.FORMS[form].format(a=a)
        if name in ("clamp", "hardtanh", "clamp_min", "clamp_max"):
            a = self.value(args[0], idx)

            def arg(i: int, key: str, default: Any) -> Any:  # positional, keyword, or the op's default
                return args[i] if len(args) > i else kw.get(key, default)

            lo, hi = {"hardtanh": lambda: (arg(1, "min_val", -1.0), arg(2, "max_val", 1.0)),
                      "clamp": lambda: (arg(1, "min", None), arg(2, "max", None)),
                      "clamp_min": lambda: (arg(1, "min", None), None),
                      "clamp_max": lambda: (None, arg(1, "max", None))}[name]()
            if isinstance(lo, torch.fx.Node) or isinstance(hi, torch.fx.Node):
                raise NotMine("tensor clamp bounds")
            expr = a if lo is None else self.FORMS["max"].format(a=a, b=self.lit(lo))
            return expr if hi is None else self.FORMS["min"].format(a=expr, b=self.lit(hi))
        if name == "leaky_relu":
            a = self.value(args[0], idx)
            return self.FORMS["leaky"].format(a=a, s=self.lit(args[1] if len(args) > 1 else 0.01))
        if name == "_native_batch_norm_legit_no_training":
            x, w, b, mean, var = args[:5]
            eps = args[6]
            c = unflatten(idx, out)[1] if len(out) > 1 else sympy.Integer(0)
            xv = self.value(x, idx)
            mv, vv = self.value(mean, c), self.value(var, c)
            wv = self.value(w, c) if w is not None else self.FORMS["one"]
            bv = self.value(b, c) if b is not None else self.FORMS["zero"]
            rstd = f"({self.FORMS['one']} / {self.UNARY['sqrt'].format(a=f'{vv} + {self.lit(eps)}')})"
            return f"(({xv} - {mv}) * {rstd} * {wv} + {bv})"
        raise NotMine(f"no recipe for aten.{name}")


def trace_task(spec: TaskSpec) -> torch.fx.GraphModule:
    """The task's reference traced back to an ATen graph on meta tensors; NotMine if it cannot be. Traced
    once per source and inputs (the recipes only read the graph): every rendering of a task needs it."""
    return _trace(spec.source, spec.inputs)


@functools.lru_cache(maxsize=64)
def _trace(source: str, inputs: tuple[TensorMeta, ...]) -> torch.fx.GraphModule:
    fake = [torch.empty_strided(m.shape, m.stride, dtype=m.torch_dtype, device="meta") for m in inputs]
    fn = compile_source(source)
    try:
        return make_fx(lambda *args: fn(*args))(*fake)  # the lambda hides region's optional `device`
    except Exception as e:
        raise NotMine(f"cannot trace the task: {type(e).__name__}: {str(e)[:100]}") from e


def guard_checks(inputs: tuple[TensorMeta, ...]) -> str:
    """The launcher's C condition that is true when the inputs are not the ranks, shapes and strides the
    kernel was generated for (strides of size-1 dimensions do not matter)."""
    checks = [f"in[{i}].ndim != {len(m.shape)}" for i, m in enumerate(inputs)]
    checks += [f"in[{i}].shape[{d}] != {s}" for i, m in enumerate(inputs) for d, s in enumerate(m.shape)]
    checks += [f"in[{i}].stride[{d}] != {s}" for i, m in enumerate(inputs) for d, s in enumerate(m.stride)
               if m.shape[d] > 1]
    return " || ".join(checks) or "0"
