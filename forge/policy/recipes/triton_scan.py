"""Recipe: a scan task (forge.capture.scans) -> one Triton kernel for the GPU, the gated delta rule's recurrent form.

The library's reference walks the sequence in chunks (forge.policy.recipes.scan writes that loop in C for the
CPU). Here the same rule is written token by token, as FLA's fused recurrent kernel does it: one program per
(batch, value head, block of `block_v` value columns), the state S [k_dim, block_v] in registers in float32, and
for each token t, with q and k L2-normalised (`use_qk_l2norm_in_kernel`) and q scaled by 1/sqrt(k_dim):

    S *= exp(g_t);  u = beta_t * (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t

The chunked form is this recurrence regrouped (eager pads the tail chunk with zeros, which change nothing), so
the outputs agree to rounding; the final state is S after the last token, as float32. Operands are the scan
lowering's (any float dtype and strides, the region's views folded into offsets); sizes and strides are
constants of the module, and its `launch` returns 2 for other tensors, as every recipe's does. Each program reads
q and k in full (value blocks of one head share them through the cache): `block_v` trades programs (parallelism)
against those repeated reads and the per-token reductions over k_dim; `prefetch` loads token t+1's operands
before token t's step, so their latency hides behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge.backends import TRITON
from forge.kernel import Candidate, TaskSpec
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.scan import Operand, ScanLowered
from forge.policy.recipes.triton_common import PRELUDE, TL_DTYPES, launcher, params, wide_index

STATE_MAX = 128 * 128  # floats of a program's state (k_dim padded x block_v): past it, registers spill


@dataclass(frozen=True)
class TritonScanKnobs:
    """Schedule of the recurrent gated delta rule: value columns per program, warps, and loads one token ahead."""

    block_v: int = 32
    warps: int = 4
    prefetch: bool = False


def seeds(low: ScanLowered) -> list[TritonScanKnobs]:
    """The root's schedules: FLA's (8 columns, one warp) and wider blocks with more warps, each with and without
    the prefetch."""
    base = [TritonScanKnobs(8, 1), TritonScanKnobs(16, 2), TritonScanKnobs(32, 4), TritonScanKnobs(64, 4)]
    return base + [TritonScanKnobs(k.block_v, k.warps, prefetch=True) for k in base[:3]]


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _at(op: Operand, *index: str) -> str:
    """The pointer expression of `op` at `index` (one name per dimension; "" for a dimension walked elsewhere)."""
    terms = [str(op.offset)] if op.offset else []
    terms += [f"{i} * {s}" for i, s in zip(index, op.stride, strict=True) if i and s]
    return f"in{op.slot}_p + " + " + ".join(terms)


def _cast(value: str, dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return value
    if dtype not in TL_DTYPES or not dtype.is_floating_point:
        raise NotMine(f"a scan output of dtype {dtype}")
    return f"{value}.to({TL_DTYPES[dtype]})"


def _pointers(low: ScanLowered) -> list[str]:
    """Statements: each operand's pointer at token 0 of this program's (batch, head, columns)."""
    out = low.outputs[low.out].written() if low.out >= 0 else None
    lines = [f"pq = {_at(low.q, 'b', '', 'hk', 'a')}", f"pk = {_at(low.k, 'b', '', 'hk', 'a')}",
             f"pv = {_at(low.v, 'b', '', 'h', 'd')}", f"pg = {_at(low.g, 'b', '', 'h')}",
             f"pb = {_at(low.beta, 'b', '', 'h')}"]
    if out is not None:
        st = out.stride
        lines.append(f"po = out{low.out}_p + b * {st[0]} + h * {st[2]} + d * {st[3]}")
    return lines


def _loads(low: ScanLowered, suffix: str, mask: str) -> list[str]:
    """Statements: one token's q, k, v, g and beta as float32 (`mask`: a scalar condition, "" for none)."""
    both = f" & ({mask})" if mask else ""
    scalar = f", mask={mask}, other=0.0" if mask else ""
    return [f"q{suffix} = tl.load(pq, mask=ma{both}, other=0.0).to(tl.float32)",
            f"k{suffix} = tl.load(pk, mask=ma{both}, other=0.0).to(tl.float32)",
            f"v{suffix} = tl.load(pv, mask=md{both}, other=0.0).to(tl.float32)",
            f"gt{suffix} = tl.load(pg{scalar}).to(tl.float32)",
            f"bt{suffix} = tl.load(pb{scalar}).to(tl.float32)"]


def _advance(low: ScanLowered) -> list[str]:
    """Statements: every operand's pointer moved to the next token."""
    lines = [f"pq += {low.q.stride[1]}", f"pk += {low.k.stride[1]}", f"pv += {low.v.stride[1]}",
             f"pg += {low.g.stride[1]}", f"pb += {low.beta.stride[1]}"]
    if low.out >= 0:
        lines.append(f"po += {low.outputs[low.out].written().stride[1]}")
    return lines


def _step(low: ScanLowered) -> list[str]:
    """Statements: one token's step of the recurrence (module doc), its output stored."""
    norm = ["q = q * (1.0 / tl.sqrt(tl.sum(q * q, axis=0) + 1e-06))",
            "k = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-06))"] if low.l2norm else []
    lines = [*norm, f"q = q * {low.k_dim ** -0.5!r}",
             "S = S * tl.exp(gt)",
             "u = (v - tl.sum(S * k[:, None], axis=0)) * bt",
             "S = S + k[:, None] * u[None, :]"]
    if low.out >= 0:
        o = _cast("tl.sum(S * q[:, None], axis=0)", low.outputs[low.out].torch_dtype)
        lines.append(f"tl.store(po, {o}, mask=md)")
    return lines


def _state(low: ScanLowered) -> tuple[list[str], list[str]]:
    """Statements: the state set from the initial one (or zeros), and the final state stored (if asked)."""
    both = "ma[:, None] & md[None, :]"
    if low.state is None:
        first = ["S = tl.zeros([BK, BV], dtype=tl.float32)"]
    else:
        at = _at(low.state, "b", "h", "a[:, None]", "d[None, :]")
        first = [f"S = tl.load({at}, mask={both}, other=0.0).to(tl.float32)"]
    if low.final < 0:
        return first, []
    m = low.outputs[low.final].written()
    st = m.stride
    at = f"out{low.final}_p + b * {st[0]} + h * {st[1]} + a[:, None] * {st[2]} + d[None, :] * {st[3]}"
    return first, [f"tl.store({at}, {_cast('S', m.torch_dtype)}, mask={both})"]


def _loop(low: ScanLowered, prefetch: bool) -> list[str]:
    """The token loop; with `prefetch`, token t+1's operands are loaded (masked past the end) before token t's
    step, into registers the next iteration starts from."""
    ind = "    "
    if not prefetch:
        body = [*_loads(low, "", ""), *_step(low), *_advance(low)]
        return [f"for t in range(0, {low.seq}):", *(ind + line for line in body)]
    moves = _advance(low)
    body = ["q = q_n", "k = k_n", "v = v_n", "gt = gt_n", "bt = bt_n", *moves[:5],
            *_loads(low, "_n", f"t + 1 < {low.seq}"), *_step(low), *moves[5:]]
    return [*_loads(low, "_n", ""), f"for t in range(0, {low.seq}):", *(ind + line for line in body)]


def source(spec: TaskSpec, low: ScanLowered, knobs: TritonScanKnobs) -> str:
    """The Triton module of the scan task with these knobs; NotMine where the recipe does not write it."""
    if knobs.block_v & (knobs.block_v - 1) or knobs.block_v < 1:
        raise NotMine(f"block_v {knobs.block_v} is not a power of two")
    if any(op.dtype == torch.float64 for op in (low.q, low.k, low.v, low.g, low.beta)):
        raise NotMine("float64: the Triton recipes compute in float32")
    bk, bv = _pow2(low.k_dim), min(knobs.block_v, _pow2(low.v_dim))
    if bk * bv > STATE_MAX:
        raise NotMine(f"a state block of {bk} x {bv} floats does not fit a program's registers")
    first, final = _state(low)
    pid = "tl.program_id(0).to(tl.int64)" if wide_index(spec) else "tl.program_id(0)"
    head = [f"bh = {pid}", f"b = bh // {low.v_heads}", f"h = bh % {low.v_heads}",
            f"hk = h // {low.v_heads // low.k_heads}",
            "a = tl.arange(0, BK)", "d = tl.program_id(1) * BV + tl.arange(0, BV)",
            f"ma = a < {low.k_dim}", f"md = d < {low.v_dim}"]
    body = [*head, *_pointers(low), *first, *_loop(low, knobs.prefetch), *final]
    grid = f"{low.batch * low.v_heads}, {-(-low.v_dim // bv)}"
    return (f"{PRELUDE}\n# forge recipe: scan (gated delta rule, recurrent) in Triton, {low.batch} x {low.v_heads} "
            f"heads of {low.seq} tokens, state {low.k_dim} x {low.v_dim}, {knobs}\n\n"
            f"@triton.jit\ndef forge_scan({params(spec)}, BK: tl.constexpr, BV: tl.constexpr):\n"
            + "".join(f"    {line}\n" for line in body) + "\n\n"
            + launcher(spec, "forge_scan", grid, f"BK={bk}, BV={bv}", knobs.warps))


def candidate(spec: TaskSpec, low: ScanLowered, knobs: TritonScanKnobs) -> Candidate:
    """A triton Candidate for these knobs."""
    return Candidate(TRITON.name, source(spec, low, knobs))
