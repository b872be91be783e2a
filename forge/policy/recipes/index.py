"""Index algebra of the recipes: symbolic element indices, simplified with the loop variables' ranges.

Every value of a traced region is evaluated at a symbolic flat index of its own shape (sympy, with
Inductor's FloorDiv and ModularIndexing). Views, broadcasting, permutes and slices rewrite the index;
an input is loaded at the sum of its coordinates times its real strides. Simplifying with the loop
ranges turns `((r*256 + j) // 256 % 256) * 512 + (r*256 + j) % 256` into `512*(r % 256) + j`, so the
inner loop reads memory at unit stride and vectorises. The printed C uses the kernel's `idx_t`.
"""

from __future__ import annotations

import functools

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from forge.capture.export import contiguous_stride

Expr = sympy.Expr


class UnprintableIndex(Exception):
    """An index expression the C printer does not know (the recipe then says "not mine")."""


def var(name: str) -> sympy.Symbol:
    """A loop variable (a non-negative integer)."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


def unflatten(idx: Expr, shape: tuple[int, ...]) -> list[Expr]:
    """Each dimension's coordinate for a flat row-major index into `shape` (0 for size-1 dimensions)."""
    stride = contiguous_stride(shape)
    return [ModularIndexing(idx, st, s) if s > 1 else sympy.Integer(0) for s, st in zip(shape, stride, strict=True)]


def flatten(coords: list[Expr], shape: tuple[int, ...], stride: tuple[int, ...] | None = None) -> Expr:
    """The offset of coordinates in a tensor of `shape` with `stride` (row-major when None)."""
    stride = stride or contiguous_stride(shape)
    return sympy.Add(*[c * st for c, s, st in zip(coords, shape, stride, strict=True) if s > 1 and st])


class Simplifier:
    """Simplifies index expressions given the ranges of the loop variables."""

    def __init__(self, ranges: dict[sympy.Symbol, int]) -> None:
        from torch._inductor.sizevars import SizeVarAllocator  # heavy import, only when a recipe runs

        self.ranges = dict(ranges)
        self.sv = SizeVarAllocator()

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one Simplifier per lowering, short-lived
    def __call__(self, e: Expr) -> Expr:
        return self.sv.simplify_with_ranges(sympy.expand(e), self.ranges) if isinstance(e, sympy.Basic) else e


def cexpr(e: Expr) -> str:
    """C source of a simplified index expression (non-negative operands, so / and % are floor ops)."""
    if isinstance(e, (int, sympy.Integer)):
        return str(int(e))
    if isinstance(e, sympy.Symbol):
        return e.name
    if isinstance(e, ModularIndexing):
        x, d, m = e.args
        inner = cexpr(x) if d == 1 else f"{cexpr(x)} / {int(d)}"
        return f"(({inner}) % {int(m)})"
    if isinstance(e, FloorDiv):
        return f"({cexpr(e.args[0])} / {int(e.args[1])})"
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(cexpr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(cexpr(a) for a in e.args) + ")"
    raise UnprintableIndex(f"cannot print index {e}")


def unit_stride_in(e: Expr, k: sympy.Symbol) -> bool:
    """True when `e` is `f(other variables) + k` or does not use k: a unit-stride or invariant load."""
    with_k = [t for t in sympy.Add.make_args(e) if t.has(k)]
    return not with_k or with_k == [k]
