"""What the Triton recipes share: the module's prelude, the schedule knobs, the index printer, the emitter that
writes the recipes' lowering as Triton, and the launcher's plumbing. See forge.policy.recipes.triton_kernels."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from forge.capture.export import TensorMeta
from forge.kernel import TaskSpec
from forge.policy.recipes.emit import Emitter, NotMine
from forge.policy.recipes.index import Expr, Simplifier, UnprintableIndex

# Helpers of every generated module (the ABI allows function definitions decorated by triton only). tanh through
# the sigmoid: triton.language has no tanh that both Triton 3.6 and 3.8 lower on every backend and the interpreter.
PRELUDE = '''import triton
import triton.language as tl


@triton.jit
def forge_tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def forge_max(a, b):  # NaN wins, as in torch
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def forge_min(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def forge_pow(a, b):  # a ** b for float b: |a| ** b, negative for a negative base and an odd integer b
    m = tl.exp2(b * tl.log2(tl.abs(a)))
    whole = tl.floor(b) == b
    odd = whole & (tl.floor(b * 0.5) * 2.0 != b)
    m = tl.where(a < 0.0, tl.where(whole, tl.where(odd, -m, m), float("nan")), m)
    return tl.where(b == 0.0, 1.0, m)
'''


@dataclass(frozen=True)
class TritonKnobs:
    """Pointwise schedule: elements per program and warps per program."""

    block: int = 1024
    warps: int = 4


@dataclass(frozen=True)
class TritonRowKnobs:
    """Row schedule: a program per row; `chunk` 0 keeps the whole row in one block (registers), else the row is
    walked in blocks of `chunk` elements, twice (statistics, then the epilogue), the second pass re-reading it."""

    chunk: int = 0
    warps: int = 4


TL_DTYPES = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
             torch.uint8: "tl.uint8"}
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
WHOLE_ROW_MAX = 32768  # elements a block may hold (next power of two of the row): past it, registers spill


def texpr(e: Expr) -> str:
    """Python source of a simplified index expression (non-negative operands: // and % are floor ops)."""
    if isinstance(e, (int, sympy.Integer)):
        return str(int(e))
    if isinstance(e, sympy.Symbol):
        return e.name
    if isinstance(e, ModularIndexing):
        x, d, m = e.args
        inner = texpr(x) if d == 1 else f"({texpr(x)} // {int(d)})"
        return f"({inner} % {int(m)})"
    if isinstance(e, FloorDiv):
        return f"({texpr(e.args[0])} // {int(e.args[1])})"
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(texpr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(texpr(a) for a in e.args) + ")"
    raise UnprintableIndex(f"cannot print index {e}")


def lit(x: Any) -> str:
    """A scalar constant in Python."""
    if isinstance(x, bool):
        return "1.0" if x else "0.0"
    if isinstance(x, (int, float)):
        if math.isinf(x):
            return 'float("inf")' if x > 0 else '(-float("inf"))'
        if math.isnan(x):
            return 'float("nan")'
        return repr(float(x))
    raise NotMine(f"unsupported scalar argument {x!r}")


_TL_UNARY = {
    "exp": "tl.exp({a})", "log": "tl.log({a})", "sqrt": "tl.sqrt({a})", "rsqrt": "(1.0 / tl.sqrt({a}))",
    "sigmoid": "tl.sigmoid({a})", "tanh": "forge_tanh({a})", "neg": "(-{a})", "abs": "tl.abs({a})",
    "relu": "forge_max({a}, 0.0)", "erf": "tl.erf({a})", "log1p": "tl.log(1.0 + {a})",
    "expm1": "(tl.exp({a}) - 1.0)", "reciprocal": "(1.0 / {a})", "sin": "tl.sin({a})", "cos": "tl.cos({a})",
    "silu": "({a} * tl.sigmoid({a}))", "logical_not": "tl.where({a} == 0.0, 1.0, 0.0)",
    "bitwise_not": "tl.where({a} == 0.0, 1.0, 0.0)", "floor": "tl.floor({a})", "ceil": "tl.ceil({a})",
    "sign": "tl.where({a} > 0.0, 1.0, tl.where({a} < 0.0, -1.0, 0.0))", "exp2": "tl.exp2({a})",
    "log2": "tl.log2({a})", "isnan": "tl.where({a} != {a}, 1.0, 0.0)",
    "hardsigmoid": "(forge_min(forge_max({a} + 3.0, 0.0), 6.0) / 6.0)",
    "hardswish": "({a} * forge_min(forge_max({a} + 3.0, 0.0), 6.0) / 6.0)",
    "mish": "({a} * forge_tanh(tl.log(1.0 + tl.exp({a}))))",
}
_TL_BINARY = {"mul": "({a} * {b})", "div": "({a} / {b})", "maximum": "tl.maximum({a}, {b})",
              "minimum": "tl.minimum({a}, {b})", "pow": "forge_pow({a}, {b})",
              "eq": "tl.where({a} == {b}, 1.0, 0.0)", "ne": "tl.where({a} != {b}, 1.0, 0.0)",
              "lt": "tl.where({a} < {b}, 1.0, 0.0)", "le": "tl.where({a} <= {b}, 1.0, 0.0)",
              "gt": "tl.where({a} > {b}, 1.0, 0.0)", "ge": "tl.where({a} >= {b}, 1.0, 0.0)",
              "logical_and": "tl.where(({a} != 0.0) & ({b} != 0.0), 1.0, 0.0)",
              "logical_or": "tl.where(({a} != 0.0) | ({b} != 0.0), 1.0, 0.0)",
              "bitwise_and": "tl.where(({a} != 0.0) & ({b} != 0.0), 1.0, 0.0)",
              "bitwise_or": "tl.where(({a} != 0.0) | ({b} != 0.0), 1.0, 0.0)"}
_TL_FORMS = {
    "one": "1.0", "zero": "0.0", "select": "tl.where({c} != 0.0, {a}, {b})",
    "max": "forge_max({a}, {b})", "min": "forge_min({a}, {b})", "leaky": "tl.where({a} > 0.0, {a}, {s} * {a})",
    "gelu": "(0.5 * {a} * (1.0 + tl.erf({a} * 0.7071067811865476)))",
    "gelu_tanh": "(0.5 * {a} * (1.0 + forge_tanh(0.7978845608028654 * ({a} + 0.044715 * {a} * {a} * {a}))))",
    "round_bf16": "({a}).to(tl.bfloat16).to(tl.float32)", "round_f16": "({a}).to(tl.float16).to(tl.float32)",
    "to_bool": "tl.where({a} != 0.0, 1.0, 0.0)", "exp": "tl.exp({a})", "log": "tl.log({a})",
}


class TritonEmitter(Emitter):
    """The recipes' lowering (forge.policy.recipes.emit) written as Triton: float32 arithmetic on blocks.

    `block`: the index variables that are blocks (`tl.arange`), the others scalars (the program's row); a load
    whose offset uses one is masked by `mask`. `vectors`: the names bound to blocks (the rest are scalars, which a
    store broadcasts first).
    """

    UNARY = _TL_UNARY
    BINARY = _TL_BINARY
    FORMS = _TL_FORMS

    def __init__(self, inputs: dict[torch.fx.Node, int], metas: tuple[TensorMeta, ...], simplify: Simplifier,
                 block: tuple[sympy.Symbol, ...], prefix: str = "t", special: dict[torch.fx.Node, Any] | None = None,
                 mask: str = "mask") -> None:
        super().__init__(inputs, metas, simplify, prefix, special)
        self.block, self.mask = block, mask
        self.vectors: set[str] = {s.name for s in block}

    def is_vector(self, expr: str) -> bool:
        """Whether an expression is a block (it names a block variable or value)."""
        return bool(set(_NAME.findall(expr)) & self.vectors)

    def lit(self, x: Any) -> str:
        return lit(x)

    def declare(self, name: str, expr: str) -> str:
        if self.is_vector(expr):
            self.vectors.add(name)
        return f"{name} = {expr}"

    def raw_load(self, i: int, off: Expr) -> str:
        at = texpr(off)
        if any(off.has(v) for v in self.block):
            return f"tl.load(in{i}_p + {at}, mask={self.mask}, other=0)"
        return f"tl.load(in{i}_p + {at})"

    def as_float(self, raw: str, dtype: torch.dtype) -> str:
        if dtype == torch.float64:
            raise NotMine("float64: the Triton recipes compute in float32")
        return f"{raw}.to(tl.float32)"

    def power(self, a: str, e: float) -> str:
        if e == int(e) and 0 <= abs(e) <= 8:  # a small whole power: multiplications, as eager's pow does
            prod = " * ".join([a] * int(abs(e))) or "1.0"
            return f"(1.0 / ({prod}))" if e < 0 else f"({prod})"
        if e == 0.5:
            return f"tl.sqrt({a})"
        return f"forge_pow({a}, {lit(e)})"


def store(j: int, m: TensorMeta, at: str, value: str, em: TritonEmitter, shape: str = "", mask: str = "") -> str:
    """The statement storing `value` (a float) as output `j`'s dtype at offset `at`; `shape`: the block shape a
    scalar value is broadcast to first (a block store), "" for a scalar store."""
    if value in em.vectors or em.is_vector(value) or not shape:
        v = value
    else:
        v = f"({value} + tl.zeros({shape}, dtype=tl.float32))"
    dtype = m.torch_dtype
    if dtype == torch.bool:
        v = f"({v} != 0.0)"
    elif dtype in (torch.float16, torch.bfloat16, torch.uint8):
        v = f"({v}).to({TL_DTYPES[dtype]})"
    elif dtype != torch.float32:
        raise NotMine(f"stores {dtype}")
    return f"tl.store(out{j}_p + {at}, {v}{f', mask={mask}' if mask else ''})"


def params(spec: TaskSpec) -> str:
    """The kernel's pointer parameters."""
    return ", ".join([f"in{i}_p" for i in range(len(spec.inputs))] + [f"out{j}_p" for j in range(len(spec.outputs))])


def args(spec: TaskSpec) -> str:
    """The launcher's tensors, in the kernel's order."""
    return ", ".join([f"inputs[{i}]" for i in range(len(spec.inputs))]
                     + [f"outputs[{j}]" for j in range(len(spec.outputs))])


def guard(spec: TaskSpec) -> str:
    """The launcher's Python condition, true when the inputs are not the ranks, shapes and strides the kernel was
    written for (strides of size-1 dimensions do not matter)."""
    checks = [f"tuple(inputs[{i}].shape) != {tuple(m.shape)!r}" for i, m in enumerate(spec.inputs)]
    checks += [f"inputs[{i}].stride({d}) != {s}" for i, m in enumerate(spec.inputs) for d, s in enumerate(m.stride)
               if m.shape[d] > 1]
    return " or ".join(checks) or "False"


def launcher(spec: TaskSpec, kernel: str, grid: str, constexprs: str, warps: int) -> str:
    """`launch(inputs, outputs)`: the guards (1: wrong counts, 2: other tensors), then one launch."""
    return (f"def launch(inputs, outputs):\n"
            f"    if len(inputs) != {len(spec.inputs)} or len(outputs) != {len(spec.outputs)}:\n        return 1\n"
            f"    if {guard(spec)}:\n        return 2\n"
            f"    {kernel}[({grid},)]({args(spec)}, {constexprs}, num_warps={warps})\n    return 0\n")


def wide_index(spec: TaskSpec) -> bool:
    """Whether an element offset may pass 2^31 (indices then in int64)."""
    def extent(m: TensorMeta) -> int:
        return 1 + sum((s - 1) * abs(st) for s, st in zip(m.shape, m.stride, strict=True))
    return max([extent(m) for m in spec.inputs] + [m.numel for m in spec.outputs] + [1]) >= 2**31 - 1
