"""Triton recipe for row reductions: a program per row, the row in one block or walked in chunks."""

from __future__ import annotations

from typing import Any

import torch.fx

from forge.kernel import TaskSpec
from forge.policy.recipes import rowreduce
from forge.policy.recipes.emit import NotMine, trace_task
from forge.policy.recipes.index import Expr, Simplifier, flatten, unflatten, var
from forge.policy.recipes.triton_common import (
    PRELUDE,
    WHOLE_ROW_MAX,
    TritonEmitter,
    TritonRowKnobs,
    launcher,
    lit,
    params,
    store,
    texpr,
    wide_index,
)

_NEG_INF = '(-float("inf"))'
_SOFTMAX = ("_softmax", "_log_softmax", "logsumexp")
_VARIANCE = ("native_layer_norm", "native_group_norm", "var")


def _whole_stats(op: str, x: str, length: int, eps: str) -> list[str]:
    """Statistics over a row held whole in one block (`mask`: its elements)."""
    if op in _SOFTMAX:
        return [f"xm = tl.where(mask, {x}, {_NEG_INF})", "mx = tl.max(xm, axis=0)",
                f"sm = tl.sum(tl.where(xm != {_NEG_INF}, tl.exp(xm - mx), 0.0), axis=0)", "inv_sm = 1.0 / sm"]
    if op in ("amax", "amin"):
        name, fn, init = ("mx", "max", _NEG_INF) if op == "amax" else ("mn", "min", 'float("inf")')
        return [f"{name} = tl.{fn}(tl.where(mask, {x}, {init}), axis=0)"]
    if op in ("mean", "sum"):
        return [f"sm = tl.sum(tl.where(mask, {x}, 0.0), axis=0)", f"mean = sm / {length}"]
    # mean and variance, exactly: the deviations from the mean are in the registers
    return [f"mean = tl.sum(tl.where(mask, {x}, 0.0), axis=0) / {length}", f"d = tl.where(mask, {x} - mean, 0.0)",
            f"var_ = tl.sum(d * d, axis=0) / {length}", f"rstd = 1.0 / tl.sqrt(var_ + {eps})"]


def _chunk_stats(op: str, x: str, chunk: int) -> tuple[list[str], list[str], list[str]]:
    """Per-lane accumulators over the chunks of a row: (before the loop, in it, after it)."""
    z = f"tl.zeros([{chunk}], dtype=tl.float32)"
    if op in _SOFTMAX:  # online: a running max and sum per lane, rescaled when the max grows
        return ([f"m_v = {z} + {_NEG_INF}", f"s_v = {z}"],
                [f"v = tl.where(mask, {x}, {_NEG_INF})", "m_n = tl.maximum(m_v, v)",
                 f"s_v = s_v * tl.where(m_v == m_n, 1.0, tl.exp(m_v - m_n)) + tl.where(v == {_NEG_INF}, 0.0, "
                 "tl.exp(v - m_n))", "m_v = m_n"],
                ["mx = tl.max(m_v, axis=0)", f"sm = tl.sum(tl.where(m_v == {_NEG_INF}, 0.0, s_v * tl.exp(m_v - mx)), "
                 "axis=0)", "inv_sm = 1.0 / sm"])
    if op in ("amax", "amin"):
        name, fn, init = ("mx", "max", _NEG_INF) if op == "amax" else ("mn", "min", 'float("inf")')
        return ([f"acc = {z} + {init}"], [f"acc = tl.{fn}imum(acc, tl.where(mask, {x}, {init}))"],
                [f"{name} = tl.{fn}(acc, axis=0)"])
    if op in ("mean", "sum"):
        return [f"acc = {z}"], [f"acc += tl.where(mask, {x}, 0.0)"], ["sm = tl.sum(acc, axis=0)"]
    # sums of x - piv (the row's first value), so a large mean does not cancel the variance away
    return ([f"a1 = {z}", f"a2 = {z}"],
            [f"v = tl.where(mask, {x} - piv, 0.0)", "a1 += v", "a2 += v * v"],
            ["s1 = tl.sum(a1, axis=0)", "s2 = tl.sum(a2, axis=0)"])


def _chunk_finish(op: str, length: int, eps: str) -> list[str]:
    if op in ("mean", "sum"):
        return [f"mean = sm / {length}"]
    if op in _VARIANCE:
        return [f"m1 = s1 / {length}", "mean = piv + m1", f"var_ = tl.maximum(s2 / {length} - m1 * m1, 0.0)",
                f"rstd = 1.0 / tl.sqrt(var_ + {eps})"]
    return []


class Parts:
    """The row's emitters: prologue (pass 1), epilogue (pass 2; the same emitter when the row is whole, so the
    epilogue reuses the prologue's values) and per-row outputs; in Triton, or in `emitter`'s language (Helion's)."""

    def __init__(self, spec: TaskSpec, low: rowreduce.RowLowered, whole: bool,
                 emitter: type[TritonEmitter] = TritonEmitter) -> None:
        gm = trace_task(spec)
        self.red = next(n for n in gm.graph.nodes
                        if n.op == "call_function" and rowreduce.op_name(n.target) == low.op)
        r, j = var("r"), var("j")
        self.r, self.i = r, r * low.length + j
        self.simplify = Simplifier({r: low.rows, j: low.length})
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        inputs: dict[torch.fx.Node, int] = {p: n for n, p in enumerate(placeholders)}
        red, op, length, simplify = self.red, low.op, low.length, self.simplify
        self.pro = emitter(inputs, spec.inputs, simplify, block=(j,), prefix="p")
        self.x = self.pro.value(red.args[0], self.i)
        self.n_pro = len(self.pro.lines)
        self.epi = self.pro if whole else emitter(inputs, spec.inputs, simplify, block=(j,), prefix="e")
        epi = self.epi
        epi.special[red] = rowreduce.at_row(red, op, length, simplify, r,
                                            lambda idx: rowreduce._reduced_value(red, op, idx, epi, length))
        self.per_row = emitter(inputs, spec.inputs, simplify, block=(), prefix="q")
        per_row = self.per_row
        per_row.special[red] = lambda idx: rowreduce._reduced_value(red, op, idx, per_row, length)
        self.piv = emitter(inputs, spec.inputs, simplify, block=(), prefix="z")
        self.piv_value = self.piv.value(red.args[0], r * length) if op in _VARIANCE and not whole else ""
        (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
        self.outs: list[Any] = list(out_node.args[0])

    def stores(self, spec: TaskSpec, low: rowreduce.RowLowered, shape: str) -> tuple[list[str], list[str]]:
        """(per-element stores in the epilogue's emitter, per-row stores in the per-row one)."""
        y, rows = [], []
        for j, (o, m) in enumerate(zip(self.outs, spec.outputs, strict=True)):
            if m.numel == low.rows * low.length:
                at: Expr = self.i if m.written().contiguous else \
                    flatten(unflatten(self.i, m.shape), m.shape, m.written().stride)
                y.append(store(j, m, texpr(self.simplify(at)), self.epi.value(o, self.i), self.epi, shape, "mask"))
            elif m.numel == low.rows:
                rows.append(store(j, m, "r", self.per_row.value(o, self.r), self.per_row))
            else:
                raise NotMine("an output that is neither per element nor per row")
        return y, rows


def row_source(spec: TaskSpec, knobs: TritonRowKnobs, low: rowreduce.RowLowered | None = None) -> str:
    """The Triton module of a row-reduction task with these knobs; NotMine if it is not one."""
    low = low if low is not None else rowreduce.lower(spec)
    length = low.length
    whole = knobs.chunk == 0
    block = 1 << max(length - 1, 1).bit_length() if whole else knobs.chunk
    if block & (block - 1) or block < 16:
        raise NotMine(f"chunk {knobs.chunk} is not a power of two of at least 16")
    if whole and block > WHOLE_ROW_MAX:
        raise NotMine(f"a row of {length} is too long to hold in one block")
    parts = Parts(spec, low, whole)
    eps = lit(low.eps)
    pro_lines = parts.pro.lines[:parts.n_pro]
    y, row_stores = parts.stores(spec, low, "[BLOCK]")
    ind = "    "
    if whole:
        code = [*pro_lines, *_whole_stats(low.op, parts.x, length, eps), *parts.pro.lines[parts.n_pro:], *y]
        body = "".join(f"{ind}{line}\n" for line in code)
        head = f"{ind}j = tl.arange(0, BLOCK)\n{ind}mask = j < {length}\n"
    else:
        before, inside, after = _chunk_stats(low.op, parts.x, block)
        loop = f"{ind}for j0 in range(0, {length}, BLOCK):\n{ind * 2}j = j0 + tl.arange(0, BLOCK)\n" \
               f"{ind * 2}mask = j < {length}\n"
        piv = [*parts.piv.lines, f"piv = {parts.piv_value}"] if parts.piv_value else []
        body = ("".join(f"{ind}{line}\n" for line in piv + before) + loop
                + "".join(f"{ind * 2}{line}\n" for line in pro_lines + inside)
                + "".join(f"{ind}{line}\n" for line in after + _chunk_finish(low.op, length, eps)))
        if y:
            body += loop + "".join(f"{ind * 2}{line}\n" for line in parts.epi.lines + y)
        head = ""
    tail = "".join(f"{ind}{line}\n" for line in parts.per_row.lines + row_stores)
    pid = "tl.program_id(0).to(tl.int64)" if wide_index(spec) else "tl.program_id(0)"
    return (f"{PRELUDE}\n# forge recipe: row reduction ({low.op}) in Triton, {low.rows} rows of {length}, {knobs}\n\n"
            f"@triton.jit\ndef forge_rows({params(spec)}, BLOCK: tl.constexpr):\n"
            f"{ind}r = {pid}\n{head}{body}{tail}\n\n"
            + launcher(spec, "forge_rows", str(low.rows), f"BLOCK={block}", knobs.warps))
