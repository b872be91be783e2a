"""Helion recipe for row reductions: a tile of rows per program, the row held whole in one tile or walked in chunks.

`r` is the tile's rows as a column ([rows, 1]), `j` the row's elements in the chunk as a row ([1, chunk]); values
per element are [rows, chunk] tiles, statistics per row [rows, 1]. Helion masks the tiles' edges in loads, stores
and reductions (a max reduces over -inf there, a sum over 0).
"""

from __future__ import annotations

import functools

from forge.kernel import TaskSpec
from forge.policy.recipes import rowreduce
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.helion_common import PRELUDE, HelionEmitter, HelionRowKnobs, decorator, launcher, signature
from forge.policy.recipes.helion_common import store as helion_store
from forge.policy.recipes.index import Expr, flatten, unflatten
from forge.policy.recipes.triton_common import WHOLE_ROW_MAX, lit, texpr, wide_index
from forge.policy.recipes.triton_rows import Parts

_NEG_INF = 'float("-inf")'
_SOFTMAX = ("_softmax", "_log_softmax", "logsumexp")
_VARIANCE = ("native_layer_norm", "native_group_norm", "var")


def _acc(x: str, acc64: bool) -> str:
    return f"{x}.to(torch.float64)" if acc64 else x


def _sum(x: str, acc64: bool) -> str:
    """The row sums of a [rows, chunk] tile, as [rows, 1]."""
    return f"torch.sum({_acc(x, acc64)}, dim=1, keepdim=True)"


def _lanes(e: str, length: int, tail: bool) -> str:
    """What a sum may add up: the row's lanes only, where row_source says there is a `tail` to take out (chunks
    that do not divide the row; a row held whole in a wider tile, with float64 sums). Helion 1.5.0 (the release
    that runs with torch 2.11) leaves a tail's lanes in a sum of a tile cast to float64 (a masked load's 0, less
    the pivot or the mean, or through exp)."""
    return f"torch.where(j < {length}, {e}, 0.0)" if tail else e


def _back(acc64: bool) -> str:
    return ".to(torch.float32)" if acc64 else ""


def _whole_stats(op: str, x: str, length: int, eps: str, acc64: bool, tail: bool) -> list[str]:
    """Statistics over rows held whole (Helion masks the tile's tail in each reduction; `_lanes` where not)."""
    back = _back(acc64)
    lanes = functools.partial(_lanes, length=length, tail=tail)
    if op in _SOFTMAX:
        return [f"xv = {x}", "mx = torch.amax(xv, dim=1, keepdim=True)",
                f"sm = {_sum(lanes('torch.exp(xv - mx)'), acc64)}{back}", "inv_sm = 1.0 / sm"]
    if op in ("amax", "amin"):
        return [f"mx = torch.amax({x}, dim=1, keepdim=True)" if op == "amax" else
                f"mn = torch.amin({x}, dim=1, keepdim=True)"]
    if op in ("mean", "sum"):
        return [f"sm = {_sum(lanes(x), acc64)}{back}", f"mean = sm / {length}"]
    # mean and variance, exactly: the deviations from the mean are in the registers
    return [f"xv = {lanes(x)}", f"mean = ({_sum('xv', acc64)} / {length}){back}", f"d = {lanes('xv - mean')}",
            f"var_ = ({_sum('d * d', acc64)} / {length}){back}", f"rstd = torch.rsqrt(var_ + {eps})"]


def _chunk_stats(op: str, x: str, acc64: bool, length: int, tail: bool) -> tuple[list[str], list[str]]:
    """Per-row accumulators over the chunks of a row: (before the loop, in it); `_lanes` with a `tail`."""
    dt = "torch.float64" if acc64 else "torch.float32"
    lanes = functools.partial(_lanes, length=length, tail=tail)

    if op in _SOFTMAX:  # online: a running max and sum, rescaled when the max grows; -inf adds nothing
        return ([f"mx = hl.full([tile_r, 1], {_NEG_INF}, torch.float32)", "sm = hl.zeros([tile_r, 1], torch.float32)"],
                [f"xv = {x}", "mn = torch.maximum(mx, torch.amax(xv, dim=1, keepdim=True))",
                 f"sm = sm * torch.where(mx == mn, 1.0, torch.exp(mx - mn)) + "
                 f"torch.sum(torch.where(xv == {_NEG_INF}, 0.0, torch.exp(xv - mn)), dim=1, keepdim=True)",
                 "mx = mn"])
    if op in ("amax", "amin"):
        name, fn, init = ("mx", "max", _NEG_INF) if op == "amax" else ("mn", "min", 'float("inf")')
        return ([f"{name} = hl.full([tile_r, 1], {init}, torch.float32)"],
                [f"{name} = torch.{fn}imum({name}, torch.a{fn}({x}, dim=1, keepdim=True))"])
    if op in ("mean", "sum"):
        return [f"acc = hl.zeros([tile_r, 1], {dt})"], [f"acc = acc + {_sum(lanes(x), acc64)}"]
    # sums of x - piv (the row's first value), so a large mean does not cancel the variance away
    return ([f"a1 = hl.zeros([tile_r, 1], {dt})", f"a2 = hl.zeros([tile_r, 1], {dt})"],
            [f"v = {lanes(f'{x} - piv')}", f"a1 = a1 + {_sum('v', acc64)}", f"a2 = a2 + {_sum('v * v', acc64)}"])


def _chunk_finish(op: str, length: int, eps: str, acc64: bool) -> list[str]:
    back = _back(acc64)
    if op in _SOFTMAX:
        return ["inv_sm = 1.0 / sm"]
    if op in ("mean", "sum"):
        return [f"sm = acc{back}", f"mean = sm / {length}"]
    if op in _VARIANCE:
        return [f"m1 = a1 / {length}", f"mean = piv + m1{back}",
                f"var_ = torch.clamp_min(a2 / {length} - m1 * m1, 0.0){back}", f"rstd = torch.rsqrt(var_ + {eps})"]
    return []


def _stores(spec: TaskSpec, low: rowreduce.RowLowered, parts: Parts) -> tuple[list[str], list[str]]:
    """(per-element stores in the epilogue's emitter, per-row stores in the per-row one)."""
    y, rows = [], []
    for n, (o, m) in enumerate(zip(parts.outs, spec.outputs, strict=True)):
        if m.numel == low.rows * low.length:
            at: Expr = parts.i if m.written().contiguous else \
                flatten(unflatten(parts.i, m.shape), m.shape, m.written().stride)
            y.append(helion_store(n, m, texpr(parts.simplify(at)), parts.epi.value(o, parts.i), parts.epi,  # type: ignore[arg-type]
                                  spread="(r + j)"))
        elif m.numel == low.rows:
            rows.append(helion_store(n, m, "r", parts.per_row.value(o, parts.r), parts.per_row))  # type: ignore[arg-type]
        else:
            raise NotMine("an output that is neither per element nor per row")
    return y, rows


def _block(lines: list[str], depth: int) -> str:
    return "".join(f"{'    ' * depth}{line}\n" for line in lines)


def row_source(spec: TaskSpec, knobs: HelionRowKnobs, low: rowreduce.RowLowered | None = None) -> str:
    """The Helion module of a row-reduction task with these knobs; NotMine if it is not one."""
    low = low if low is not None else rowreduce.lower(spec)
    length, whole = low.length, knobs.passes == 1
    if knobs.passes not in (1, 2):
        raise NotMine(f"passes {knobs.passes}: one or two")
    full = 1 << max(length - 1, 1).bit_length()  # the whole row's tile
    if whole and full > WHOLE_ROW_MAX:
        raise NotMine(f"a row of {length} is too long to hold in one tile")
    if knobs.chunk & (knobs.chunk - 1) or knobs.rows & (knobs.rows - 1) or knobs.chunk < 16:
        raise NotMine(f"rows {knobs.rows} and chunk {knobs.chunk} must be powers of two (chunk at least 16)")
    if whole and knobs.rows * full > WHOLE_ROW_MAX:
        raise NotMine(f"{knobs.rows} rows of {length} are too many to hold in one tile")
    parts = Parts(spec, low, whole, HelionEmitter)
    eps, acc64 = lit(low.eps), knobs.acc64
    pro_lines = parts.pro.lines[:parts.n_pro]
    y, row_stores = _stores(spec, low, parts)
    per_row = parts.per_row.lines + row_stores
    if whole:  # one loop of one tile: statistics, epilogue and per-row outputs all inside it
        inner = [*pro_lines, *_whole_stats(low.op, parts.x, length, eps, acc64, acc64 and length != full),
                 *parts.pro.lines[parts.n_pro:], *y, *per_row]
        body = (f"        for tile_j in hl.tile({length}, block_size={full}):\n"
                f"            j = tile_j.index[None, :]\n{_block(inner, 3)}")
        block_sizes = [knobs.rows]
    else:
        before, inside = _chunk_stats(low.op, parts.x, acc64, length, length % knobs.chunk != 0)
        loop = f"        for tile_j in hl.tile({length}):\n            j = tile_j.index[None, :]\n"
        piv = [*parts.piv.lines, f"piv = {parts.piv_value}"] if parts.piv_value else []
        body = (_block(piv + before, 2) + loop + _block(pro_lines + inside, 3)
                + _block(_chunk_finish(low.op, length, eps, acc64), 2))
        if y:
            body += loop + _block(parts.epi.lines + y, 3)
        body += _block(per_row, 2)
        block_sizes = [knobs.rows, knobs.chunk, knobs.chunk] if y else [knobs.rows, knobs.chunk]
    return (f"{PRELUDE}\n# forge recipe: row reduction ({low.op}) in Helion, {low.rows} rows of {length}, {knobs}\n\n\n"
            + decorator(block_sizes, knobs, wide_index(spec))
            + f"def forge_rows({signature(spec)}) -> None:\n"
            f"    for tile_r in hl.tile({low.rows}):\n        r = tile_r.index[:, None]\n{body}\n\n"
            + launcher(spec, "forge_rows"))
