"""Recipe: row reductions with a prologue and an epilogue -> one C kernel for the CPU.

A region with one reduction or normalization over its input's trailing dimensions (softmax,
log-softmax, logsumexp, mean/sum/amax, RMSNorm written out, LayerNorm, GroupNorm, whose groups are
trailing-contiguous too) becomes a loop over rows, in parallel (of PARALLEL_MIN elements or more); per row,
pass 1 evaluates the prologue and accumulates the statistics, pass 2 evaluates the epilogue at every element
and stores the outputs.
Knobs: online softmax (one pass for max and sum) or two passes; Welford or sum/sum-of-squares
variance; OpenMP schedule; SIMD reductions. Pointwise code comes from forge.policy.recipes.pointwise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from forge.backends import CPU
from forge.kernel import Candidate, TaskSpec
from forge.policy.recipes.emit import FLOAT_TYPES, Emitter, NotMine, from_float, guard_checks, lit, shape_of, trace_task
from forge.policy.recipes.index import Expr, Simplifier, cexpr, flatten, unflatten, unit_stride_in, var
from forge.policy.recipes.pointwise import PRELUDE, index_type, parallel_for, pointers
from forge.tasks.ops import Kind, kind_of, op_name

_REDUCE_OPS = {"mean", "sum", "amax", "amin", "_softmax", "_log_softmax", "logsumexp", "native_layer_norm",
               "native_group_norm", "var"}


@dataclass(frozen=True)
class RowKnobs:
    """The schedule the search explores."""

    online: bool = True  # softmax: running max and sum in one pass (else a max pass, then a sum pass)
    welford: bool = False  # variance by Welford's update (else sum and sum of squares in double)
    simd: bool = True
    chunk: int = 0  # OpenMP schedule chunk over rows (0: even split); no OpenMP below PARALLEL_MIN elements
    fast_math: bool = False  # vector exp/log from libmvec (infinities still honoured)


@dataclass(frozen=True)
class RowLowered:
    """The parts of the kernel: statistics code per row, the element loop, and the stores."""

    op: str
    rows: int
    length: int
    x_lines: tuple[str, ...]  # pass-1 prologue lines computing `x` (the reduced input) at index i
    x_expr: str
    piv_lines: tuple[str, ...]  # `x` at the row's first element (the shift of the variance sums)
    y_lines: tuple[str, ...]  # pass-2 lines at element index i (epilogue and full-size stores)
    row_stores: tuple[str, ...]  # stores of row-sized outputs, at index r
    stats: str  # how the statistics are turned into the reduce node's values (documentation only)
    n_in: int
    n_out: int
    guard: str
    pointers: str
    eps: float  # of a layer or group norm (0 otherwise)
    outer: int = 1  # the row is `outer` blocks (variable jo) of `inner` elements (ji, the vector loop)
    inner: int = 0


def lower(spec: TaskSpec) -> RowLowered:
    """Express the task as a row reduction; raises NotMine when it is not one."""
    for m in spec.inputs + spec.outputs:
        if m.torch_dtype not in FLOAT_TYPES:
            raise NotMine(f"integer tensors ({m.dtype})")
    gm = trace_task(spec)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    reds = [n for n in nodes if kind_of(n.target) is Kind.REDUCE]
    if len(reds) != 1 or any(kind_of(n.target) in (Kind.HEAVY, Kind.SINGLE) for n in nodes):
        raise NotMine("not one reduction with pointwise ops around it")
    red = reds[0]
    name = op_name(red.target)
    if name not in _REDUCE_OPS:
        raise NotMine(f"no row recipe for aten.{name}")
    x = red.args[0]
    shape = shape_of(x)
    length = _row_length(red, name, shape)
    rows = math.prod(shape) // length
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = {p: i for i, p in enumerate(placeholders)}
    for u in red.users:  # only the main output of multi-output norms
        if op_name(u.target) == "getitem" and u.args[1] != 0 and u.users:
            raise NotMine("uses the saved statistics of a normalization")
    # the row as blocks of trailing dimensions (GroupNorm: channels of H*W), the longest block first
    suffixes = {math.prod(shape[d:]) for d in range(len(shape))}
    splits = sorted({length} | {p for p in suffixes if 1 < p < length and length % p == 0}, reverse=True)
    first = None
    for inner in splits:
        low, loads = _lower_split(spec, gm, red, name, inputs, rows, length, inner)
        if all(unit_stride_in(e, var("ji")) for e in loads):
            return low
        first = first or low
    assert first is not None
    return first


def _lower_split(spec: TaskSpec, gm: torch.fx.GraphModule, red: torch.fx.Node, name: str,
                 inputs: dict[torch.fx.Node, int], rows: int, length: int, inner: int
                 ) -> tuple[RowLowered, list[Expr]]:
    r, jo, ji = var("r"), var("jo"), var("ji")
    simplify = Simplifier({r: rows, jo: length // inner, ji: inner})
    i = r * length + jo * inner + ji
    x = red.args[0]
    pro = Emitter(inputs, spec.inputs, simplify, prefix="p")
    x_expr = pro.value(x, i)
    piv = Emitter(inputs, spec.inputs, simplify, prefix="z")
    piv.lines.append(f"const float piv = {piv.value(x, r * length)};")
    epi = Emitter(inputs, spec.inputs, simplify, prefix="e",
                   special={red: at_row(red, name, length, simplify, r,
                                        lambda idx: _reduced_value(red, name, idx, epi, length))})
    per_row = Emitter(inputs, spec.inputs, simplify, prefix="q",
                       special={red: lambda idx: _reduced_value(red, name, idx, per_row, length)})
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    y_stores, row_stores = [], []
    for j, (o, m) in enumerate(zip(out_node.args[0], spec.outputs, strict=True)):
        if m.numel == rows * length:
            at = "i" if m.written().contiguous else cexpr(simplify(flatten(unflatten(i, m.shape), m.shape,
                                                                            m.written().stride)))
            v, target = epi.value(o, i), y_stores
        elif m.numel == rows:
            v, target, at = per_row.value(o, r), row_stores, "r"
        else:
            raise NotMine("an output that is neither per element nor per row")
        target.append(f"out{j}_p[{at}] = {from_float(v, m.torch_dtype)};")
    guard = guard_checks(spec.inputs)
    low = RowLowered(name, rows, length, tuple(pro.lines), x_expr, tuple(piv.lines), tuple(epi.lines + y_stores),
                     tuple(per_row.lines + row_stores), name, len(spec.inputs), len(spec.outputs), guard,
                     pointers(spec.inputs, spec.outputs),
                     float(red.args[-1]) if name in ("native_layer_norm", "native_group_norm") else 0.0,
                     length // inner, inner)
    return low, pro.loads + epi.loads


_FULL = ("_softmax", "_log_softmax", "native_layer_norm", "native_group_norm")  # results the size of the input


def same_everywhere(a: Expr, b: Expr, ranges: dict[sympy.Symbol, int], samples: int = 48) -> bool:
    """Whether two index expressions agree at the loop's corners and at random points of its ranges (views and
    permutes that come back to the same element agree everywhere, though the simplifier may not show it; a
    permuted read differs at most points)."""
    names = sorted(a.free_symbols | b.free_symbols, key=str)
    rng = random.Random(0)
    points = [{v: 0 for v in names}, {v: max(ranges.get(v, 1) - 1, 0) for v in names}]
    points += [{v: rng.randrange(max(ranges.get(v, 1), 1)) for v in names} for _ in range(samples)]
    return all(int(a.subs(pt)) == int(b.subs(pt)) for pt in points)


def at_row(red: torch.fx.Node, name: str, length: int, simplify: Simplifier, row: Expr,
           value: Callable[[Expr], str]) -> Callable[[Expr], str]:
    """The reduction's value at an index of the epilogue, from the statistics of row `row` (those the loop
    holds); NotMine when the epilogue reads it at another row (a permuted or shifted result), which those
    statistics do not describe."""
    def special(idx: Expr) -> str:
        at = FloorDiv(idx, length) if name in _FULL else idx
        if not same_everywhere(sympy.sympify(at), sympy.sympify(row), simplify.ranges):
            raise NotMine("the epilogue reads the reduction at another row than the loop's (a permuted result)")
        return value(idx)
    return special


def _row_length(red: torch.fx.Node, name: str, shape: tuple[int, ...]) -> int:
    """Elements per row; raises NotMine unless the reduction covers trailing dimensions."""
    nd = len(shape)
    if name in ("_softmax", "_log_softmax"):
        if red.args[1] % nd != nd - 1:
            raise NotMine("softmax over a dimension that is not the last")
        return shape[-1]
    if name == "native_layer_norm":
        return math.prod(red.args[1])
    if name == "native_group_norm":
        n, c, hw, g = red.args[3], red.args[4], red.args[5], red.args[6]
        return (c // g) * hw if n * c * hw == math.prod(shape) else 0
    dims = red.args[1] if len(red.args) > 1 else red.kwargs.get("dim")
    if dims is None:
        return math.prod(shape)
    dims = sorted(d % nd for d in ([dims] if isinstance(dims, int) else dims))
    if dims != list(range(nd - len(dims), nd)):
        raise NotMine("reduces dimensions that are not the trailing ones")
    if name in ("var", "var_mean") and (red.kwargs.get("correction", 1) not in (0, 1)):
        raise NotMine("variance correction other than 0 or 1")
    return math.prod(shape[nd - len(dims):])


def _reduced_value(red: torch.fx.Node, name: str, idx: Expr, epi: Emitter, length: int) -> str:
    """The reduce node's value at `idx` in pass 2, from the row statistics (mx, sm, mean, rstd)."""
    exp, log, one, zero = (epi.FORMS[f] for f in ("exp", "log", "one", "zero"))  # in the emitter's language
    if name in ("mean", "sum", "amax", "amin", "logsumexp", "var"):
        return {"mean": "mean", "sum": "sm", "amax": "mx", "amin": "mn", "logsumexp": f"(mx + {log.format(a='sm')})",
                "var": "var_"}[name]
    xv = epi.value(red.args[0], idx)
    if name == "_softmax":
        return f"({exp.format(a=f'{xv} - mx')} * inv_sm)"
    if name == "_log_softmax":
        return f"({xv} - mx - {log.format(a='sm')})"
    if name == "native_layer_norm":
        w, b = red.args[2], red.args[3]
        j = ModularIndexing(idx, 1, length)
        wv = epi.value(w, j) if w is not None else one
        bv = epi.value(b, j) if b is not None else zero
        return f"(({xv} - mean) * rstd * {wv} + {bv})"
    if name == "native_group_norm":
        w, b, c, hw = red.args[1], red.args[2], red.args[4], red.args[5]
        ch = ModularIndexing(idx, hw, c)
        wv = epi.value(w, ch) if w is not None else one
        bv = epi.value(b, ch) if b is not None else zero
        return f"(({xv} - mean) * rstd * {wv} + {bv})"
    raise NotMine(f"no row recipe for aten.{name}")


_BLOCK = 1024  # elements per float partial sum (partials are added in double)


def _loop(low: RowLowered, lines: tuple[str, ...] | list[str], pragma: str = "", pre: str = "",
          post: str = "") -> str:
    """A loop over the row's elements: blocks `jo` of `inner` elements `ji` (the vector loop, with
    `pragma`), in pieces of at most _BLOCK with `pre` before and `post` after each piece."""
    body = "\n".join(f"        {line}" for line in lines)
    head = f"        const idx_t i = base + jo * {low.inner} + ji; (void)i;\n"
    pragma = f"      {pragma}\n" if pragma else ""
    pre = f"      {pre}\n" if pre else ""
    post = f"      {post}\n" if post else ""
    if low.inner <= _BLOCK or not (pre or post):
        inner = f"{pre}{pragma}      for (idx_t ji = 0; ji < {low.inner}; ++ji) {{\n{head}{body}\n      }}\n{post}"
    else:
        inner = (f"    for (idx_t jb = 0; jb < {low.inner}; jb += {_BLOCK}) {{\n"
                 f"      const idx_t je = jb + {_BLOCK} < {low.inner} ? jb + {_BLOCK} : {low.inner};\n"
                 f"{pre}{pragma}      for (idx_t ji = jb; ji < je; ++ji) {{\n{head}{body}\n      }}\n{post}    }}\n")
    return f"    for (idx_t jo = 0; jo < {low.outer}; ++jo) {{\n{inner}    }}\n"


def _stats_code(low: RowLowered, knobs: RowKnobs, eps: str) -> str:
    """Pass 1: the row statistics the op needs."""
    x = low.x_expr
    pro = list(low.x_lines)

    def simd(clause: str) -> str:
        return f"#pragma omp simd reduction({clause})" if knobs.simd else ""

    if low.op in ("_softmax", "_log_softmax", "logsumexp"):
        if knobs.online:
            return ("    float mx = -INFINITY, sm = 0.0f;\n" + _loop(low, [
                *pro, f"const float v = {x};",
                "if (v > mx) { sm = sm * forge_expf(mx - v) + 1.0f; mx = v; }",
                "else if (v != -INFINITY) sm += forge_expf(v - mx);  // -inf - -inf would be NaN"])
                + "    const float inv_sm = 1.0f / sm; (void)inv_sm;\n")
        return ("    float mx = -INFINITY; double sm_d = 0.0;\n"
                + _loop(low, [*pro, f"bm = forge_max(bm, {x});"], simd("max:bm"), "float bm = -INFINITY;",
                        "mx = forge_max(mx, bm);")
                + _loop(low, [*pro, f"bs += forge_expf({x} - mx);"], simd("+:bs"), "float bs = 0.0f;",
                        "sm_d += bs;")
                + "    const float sm = (float)sm_d; const float inv_sm = 1.0f / sm; (void)inv_sm;\n")
    if low.op in ("amax", "amin"):
        op, init, v = ("forge_max", "-INFINITY", "mx") if low.op == "amax" else ("forge_min", "INFINITY", "mn")
        red = "max" if low.op == "amax" else "min"
        return (f"    float {v} = {init};\n"
                + _loop(low, [*pro, f"b = {op}(b, {x});"], simd(f"{red}:b"), f"float b = {init};",
                        f"{v} = {op}({v}, b);"))
    if low.op in ("mean", "sum"):
        return ("    double sm_d = 0.0;\n" + _loop(low, [*pro, f"b1 += {x};"], simd("+:b1"), "float b1 = 0.0f;",
                                                  "sm_d += b1;")
                + f"    const float sm = (float)sm_d; const float mean = (float)(sm_d / {low.length}); "
                f"(void)sm; (void)mean;\n")
    # mean and variance: layer norm, group norm, var
    if knobs.welford:
        acc = ("    double mean_d = 0.0, m2 = 0.0; int64_t cnt = 0;\n" + _loop(low, [
            *pro, f"const double v = {x}; ++cnt; const double d = v - mean_d; mean_d += d / cnt;"
            " m2 += d * (v - mean_d);"]) + f"    const double var_d = m2 / {low.length};\n")
    else:  # sums of x - piv (the row's first value), so a large mean does not cancel the variance away
        pivot = "\n".join(f"    {line}" for line in low.piv_lines)
        acc = (f"{pivot}\n    double s1 = 0.0, s2 = 0.0;\n"
               + _loop(low, [*pro, f"const float v = {x} - piv; b1 += v; b2 += v * v;"], simd("+:b1, b2"),
                       "float b1 = 0.0f, b2 = 0.0f;", "s1 += b1; s2 += b2;")
               + f"    const double m1 = s1 / {low.length};\n    const double mean_d = piv + m1;\n"
               f"    const double var_d = s2 / {low.length} - m1 * m1 > 0 ? s2 / {low.length} - m1 * m1 : 0.0;\n")
    return (acc + f"    const float mean = (float)mean_d; const float rstd = (float)(1.0 / sqrt(var_d + {eps}));"
            f" const float var_ = (float)var_d; (void)rstd; (void)var_;\n")


def emit_cpu(low: RowLowered, knobs: RowKnobs) -> str:
    """The C++ source of the row kernel with these knobs."""
    schedule = f" schedule(static, {knobs.chunk})" if knobs.chunk else " schedule(static)"
    rows = "\n".join(f"    {line}" for line in low.row_stores)
    pass2 = _loop(low, low.y_lines, "#pragma omp simd" if knobs.simd else "") if low.y_lines else ""
    return (f"{PRELUDE}\n// forge recipe: row reduction ({low.op}), {low.rows} rows of {low.outer} x {low.inner}, "
            f"{knobs}\n"
            f"extern \"C\" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {{\n"
            f"  if (n_in != {low.n_in} || n_out != {low.n_out}) return 1;\n"
            f"  if ({low.guard}) return 2;\n{low.pointers}{index_type(low.rows * low.length)}"
            f"  {parallel_for(low.rows * low.length, schedule)}\n"
            f"  for (idx_t r = 0; r < {low.rows}; ++r) {{\n"
            f"    const idx_t base = r * {low.length}; (void)base;\n"
            f"{_stats_code(low, knobs, lit(low.eps))}{pass2}{rows}\n  }}\n  return 0;\n}}\n")


def candidate(low: RowLowered, knobs: RowKnobs) -> Candidate:
    """A cpu Candidate for these knobs."""
    flags = CPU.fast_math if knobs.fast_math else CPU.exact_math
    return Candidate(CPU.name, emit_cpu(low, knobs), flags=flags)
