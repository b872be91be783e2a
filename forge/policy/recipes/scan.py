"""Recipe: a scan task (forge.capture.scans) -> one C kernel for the CPU, the whole chunk loop fused.

The gated delta rule is the only scan forge captures. Its task is the op `forge_scan::chunk_gated_delta_rule` and
the views that feed it; the pointwise recipe's lowering (forge.policy.recipes.emit) cannot express it, since each
chunk's step is four small matrix products with the pointwise and reduction work as their prologues and
epilogues. This recipe knows the op's semantics instead and writes, per (batch, value head), the loop eager runs
in many ATen calls, with every elementwise and reduction step fused into it:
- per chunk of `chunk` tokens: load q, k, v, g, beta (any dtype and strides, the views folded into the
  offsets), the L2 norms of q and k (`use_qk_l2norm_in_kernel`) and q's 1/sqrt(k_dim) scale, the cumulative
  decay (summed in double, as ATen's cumsum on the CPU), beta's scaling of k and v;
- the two chunk matrices (decayed kk^T for the triangular system, decayed qk^T for the output) and the system
  solved by forward substitution for both right-hand sides;
- the step: v_new = u - w S, out = (q e^cum) S + P v_new, S = S e^cum_last + (k e^(cum_last - cum))^T v_new, with
  the state S (k_dim x v_dim floats) on the stack of the thread that owns the head.
Positions past the end of the sequence are skipped (eager pads them with zeros, which change nothing). Heads are
spread over OpenMP threads; the inner loops run over a head's dimension, at unit stride in the state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from forge.backends import CPU
from forge.capture.export import TensorMeta
from forge.capture.scans import is_scan
from forge.kernel import Candidate, TaskSpec
from forge.policy.recipes.emit import FLOAT_TYPES, NotMine, from_float, guard_checks, to_float, trace_task
from forge.policy.recipes.pointwise import PRELUDE
from forge.tasks.ops import Kind, kind_of

RULE = "chunk_gated_delta_rule"
WORKSPACE = 1 << 18  # floats a head's thread keeps on its stack at most (1 MB)


@dataclass(frozen=True)
class ScanKnobs:
    """The schedule the search explores."""

    parallel: bool = True  # heads over OpenMP threads
    simd: bool = True  # `omp simd` on the loops over a head's dimension
    fast_math: bool = False


@dataclass(frozen=True)
class Operand:
    """A tensor the op reads: the task input it is a view of, at this offset and these strides, of this dtype."""

    slot: int
    dtype: torch.dtype
    offset: int
    stride: tuple[int, ...]

    def at(self, *index: str) -> str:
        """The element at `index` (C expressions, one a dimension) as float."""
        off = " + ".join([str(self.offset), *(f"({i}) * {s}" for i, s in zip(index, self.stride, strict=True))])
        return to_float(f"in{self.slot}_p[{off}]", self.dtype)


@dataclass(frozen=True)
class ScanLowered:
    """A gated delta rule the recipe can write: sizes, operands, and where its results go."""

    batch: int
    seq: int
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    chunk: int
    l2norm: bool
    q: Operand
    k: Operand
    v: Operand
    g: Operand
    beta: Operand
    state: Operand | None  # the initial state, if given
    out: int  # the output index of the attention output, -1 if the task does not return it
    final: int  # the output index of the final state, -1 if the task does not return it
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]


def _operand(node: torch.fx.Node, slots: dict[torch.fx.Node, int]) -> Operand:
    """The op's tensor argument as a view of a task input; NotMine if anything but views lies between."""
    val, base = node.meta["val"], node
    while base.op == "call_function":
        if kind_of(base.target) is not Kind.VIEW:
            raise NotMine(f"a scan operand is computed in the task ({base.target}), not a view of an input")
        base = base.args[0]  # type: ignore[assignment]
    if val.dtype not in FLOAT_TYPES or not val.dtype.is_floating_point:
        raise NotMine(f"a scan operand of dtype {val.dtype}")
    return Operand(slots[base], val.dtype, int(val.storage_offset()), tuple(int(s) for s in val.stride()))


def lower(spec: TaskSpec) -> ScanLowered:
    """The task as a gated delta rule over chunks; NotMine if it is not one (or not one this recipe writes)."""
    gm = trace_task(spec)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    scans = [n for n in calls if is_scan(n.target)]
    if len(scans) != 1 or scans[0].target._opname != RULE:
        raise NotMine("not a scan task (no gated delta rule op)")
    (scan,) = scans
    if any(n is not scan and kind_of(n.target) is not Kind.VIEW for n in calls):
        raise NotMine("a scan task with work besides the scan")
    slots = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    q, k, v, g, beta = (_operand(a, slots) for a in scan.args[:5])
    state = _operand(scan.args[5], slots) if scan.args[5] is not None else None
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    where = {int(o.args[1]): j for j, o in enumerate(out_node.args[0]) if o.args[0] is scan}
    if len(where) != len(out_node.args[0]):
        raise NotMine("a scan task whose outputs are not the op's")
    b, t, hk, dk = scan.args[1].meta["val"].shape
    hv, dv = scan.args[2].meta["val"].shape[-2:]
    chunk = int(scan.args[6])
    if hv % hk or chunk < 1 or dk * dv + chunk * (3 * dk + dv + 2 * chunk + 3) > WORKSPACE:
        raise NotMine(f"a gated delta rule this recipe does not write ({hk} key heads, {hv} value heads, "
                      f"{dk}x{dv} state, chunks of {chunk})")
    return ScanLowered(int(b), int(t), int(hk), int(hv), int(dk), int(dv), chunk, bool(scan.args[7]),
                       q, k, v, g, beta, state, where.get(0, -1), where.get(1, -1), spec.inputs, spec.outputs)


def _loads(low: ScanLowered, simd: str) -> str:
    """C statements: a chunk's q and k rows (L2-normalised, q scaled), u = v * beta, the decay's running sum
    (in double, stored as float), and w = k * beta * e^cum, for its `n` positions from token `c0`."""
    q, k, v, g, beta = low.q, low.k, low.v, low.g, low.beta
    norm = ("      float sq = 0.0f, sk = 0.0f;\n"
            f"      {simd.replace('simd', 'simd reduction(+:sq,sk)')}\n"
            f"      for (int a = 0; a < {low.k_dim}; ++a) {{ sq += Q[i][a] * Q[i][a]; sk += K[i][a] * K[i][a]; }}\n"
            "      const float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);\n"
            ) if low.l2norm else "      const float rq = 1.0f, rk = 1.0f;\n"
    return (f"    for (int i = 0; i < n; ++i) {{\n"
            f"      const int64_t t = c0 + i;\n"
            f"      for (int a = 0; a < {low.k_dim}; ++a) {{ Q[i][a] = {q.at('b', 't', 'hk', 'a')}; "
            f"K[i][a] = {k.at('b', 't', 'hk', 'a')}; }}\n"
            f"{norm}"
            f"      const float bi = {beta.at('b', 't', 'h')};\n"
            f"      run += (double){g.at('b', 't', 'h')};\n"
            "      cum[i] = (float)run;\n"
            "      const float ec = expf(cum[i]);\n"
            f"      {simd}\n"
            f"      for (int a = 0; a < {low.k_dim}; ++a) {{\n"
            f"        Q[i][a] = (Q[i][a] * rq) * {low.k_dim ** -0.5!r}f; K[i][a] *= rk;\n"
            "        W[i][a] = (K[i][a] * bi) * ec;\n"
            "      }\n"
            f"      for (int d = 0; d < {low.v_dim}; ++d) U[i][d] = {v.at('b', 't', 'h', 'd')} * bi;\n"
            "      bt[i] = bi;\n"
            "    }\n")


def _system(low: ScanLowered, simd: str) -> str:
    """C statements: the decayed kk^T (strictly below the diagonal) and qk^T (on and below), then u and w through
    the unit lower triangular system by forward substitution."""
    red = simd.replace("simd", "simd reduction(+:sa,sp)")
    return ("    for (int i = 0; i < n; ++i) {\n"
            "      for (int j = 0; j <= i; ++j) {\n"
            "        float sa = 0.0f, sp = 0.0f;\n"
            f"        {red}\n"
            f"        for (int a = 0; a < {low.k_dim}; ++a) {{ sa += K[i][a] * K[j][a]; sp += Q[i][a] * K[j][a]; }}\n"
            "        const float e = expf(cum[i] - cum[j]);\n"
            "        A[i][j] = (sa * bt[i]) * e; P[i][j] = sp * e;\n"
            "      }\n"
            "      for (int j = 0; j < i; ++j) {\n"
            "        const float aij = A[i][j];\n"
            f"        {simd}\n"
            f"        for (int d = 0; d < {low.v_dim}; ++d) U[i][d] -= aij * U[j][d];\n"
            f"        {simd}\n"
            f"        for (int a = 0; a < {low.k_dim}; ++a) W[i][a] -= aij * W[j][a];\n"
            "      }\n"
            "    }\n")


def _step(low: ScanLowered, simd: str) -> str:
    """C statements: one chunk's step of the recurrence (module doc), its outputs written."""
    dk, dv = low.k_dim, low.v_dim
    out = low.outputs[low.out].written() if low.out >= 0 else None
    store = (f"        out{low.out}_p[b * {out.stride[0]} + t * {out.stride[1]} + h * {out.stride[2]} + d * "
             f"{out.stride[3]}] = {from_float('o[d]', out.torch_dtype)};\n") if out is not None else ""
    return ("    for (int i = 0; i < n; ++i) {\n"
            f"      for (int a = 0; a < {dk}; ++a) {{\n        const float wa = W[i][a];\n        {simd}\n"
            f"        for (int d = 0; d < {dv}; ++d) U[i][d] -= wa * S[a][d];\n      }}\n"
            "    }\n"
            "    for (int i = 0; i < n; ++i) {\n"
            f"      float o[{dv}] = {{0.0f}};\n      const float ec = expf(cum[i]);\n"
            f"      for (int a = 0; a < {dk}; ++a) {{\n        const float qa = Q[i][a] * ec;\n        {simd}\n"
            f"        for (int d = 0; d < {dv}; ++d) o[d] += qa * S[a][d];\n      }}\n"
            "      for (int j = 0; j <= i; ++j) {\n        const float p = P[i][j];\n"
            f"        {simd}\n        for (int d = 0; d < {dv}; ++d) o[d] += p * U[j][d];\n      }}\n"
            f"      const int64_t t = c0 + i;\n      for (int d = 0; d < {dv}; ++d) {{\n{store}      }}\n"
            "    }\n"
            "    const float last = cum[n - 1], decay = expf(last);\n"
            "    for (int i = 0; i < n; ++i) ek[i] = expf(last - cum[i]);\n"
            f"    for (int a = 0; a < {dk}; ++a) {{\n"
            f"      {simd}\n      for (int d = 0; d < {dv}; ++d) S[a][d] *= decay;\n"
            "      for (int i = 0; i < n; ++i) {\n        const float ka = K[i][a] * ek[i];\n"
            f"        {simd}\n        for (int d = 0; d < {dv}; ++d) S[a][d] += ka * U[i][d];\n      }}\n"
            "    }\n")


def _state(low: ScanLowered) -> tuple[str, str]:
    """C statements: the state set from the initial one (or zeros), and the final state stored (if asked)."""
    dk, dv = low.k_dim, low.v_dim
    first = (f"  for (int a = 0; a < {dk}; ++a) for (int d = 0; d < {dv}; ++d) S[a][d] = "
             f"{low.state.at('b', 'h', 'a', 'd')};\n") if low.state else "  memset(S, 0, sizeof(S));\n"
    if low.final < 0:
        return first, ""
    m = low.outputs[low.final].written()
    at = f"b * {m.stride[0]} + h * {m.stride[1]} + a * {m.stride[2]} + d * {m.stride[3]}"
    return first, (f"  for (int a = 0; a < {dk}; ++a) for (int d = 0; d < {dv}; ++d) "
                   f"out{low.final}_p[{at}] = {from_float('S[a][d]', m.torch_dtype)};\n")


def _pointers(low: ScanLowered) -> str:
    lines = [f"  const {FLOAT_TYPES[m.torch_dtype]}* __restrict__ in{i}_p = (const {FLOAT_TYPES[m.torch_dtype]}*)"
             f"in[{i}].data;" for i, m in enumerate(low.inputs)]
    lines += [f"  {FLOAT_TYPES[m.torch_dtype]}* __restrict__ out{j}_p = ({FLOAT_TYPES[m.torch_dtype]}*)out[{j}].data;"
              for j, m in enumerate(low.outputs)]
    return "\n".join(lines) + "\n"


def emit_cpu(low: ScanLowered, knobs: ScanKnobs) -> str:
    """The C++ source of the fused scan with these knobs."""
    simd = "#pragma omp simd" if knobs.simd else ""
    c, dk, dv = low.chunk, low.k_dim, low.v_dim
    first, final = _state(low)
    par = "  #pragma omp parallel for collapse(2) schedule(static)\n" if knobs.parallel and \
        low.batch * low.v_heads > 1 else ""
    head = (f"static void forge_head(const ForgeTensor* in, ForgeTensor* out, int64_t b, int64_t h) {{\n"
            f"{_pointers(low)}"
            f"  const int64_t hk = h / {low.v_heads // low.k_heads};\n"
            f"  float S[{dk}][{dv}], Q[{c}][{dk}], K[{c}][{dk}], W[{c}][{dk}], U[{c}][{dv}];\n"
            f"  float A[{c}][{c}], P[{c}][{c}], cum[{c}], bt[{c}], ek[{c}];\n"
            f"{first}"
            f"  for (int64_t c0 = 0; c0 < {low.seq}; c0 += {c}) {{\n"
            f"    const int n = {low.seq} - c0 < {c} ? (int)({low.seq} - c0) : {c};\n"
            "    double run = 0.0;\n"
            f"{_loads(low, simd)}{_system(low, simd)}{_step(low, simd)}"
            f"  }}\n{final}  (void)hk; (void)out;\n}}\n")
    return (f"{PRELUDE}\n// forge recipe: scan (gated delta rule), {low.batch} x {low.v_heads} heads of {low.seq} "
            f"tokens in chunks of {c}, knobs {knobs}\n{head}\n"
            "extern \"C\" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {\n"
            f"  if (n_in != {len(low.inputs)} || n_out != {len(low.outputs)}) return 1;\n"
            f"  if ({guard_checks(low.inputs)}) return 2;\n{par}"
            f"  for (int64_t b = 0; b < {low.batch}; ++b)\n    for (int64_t h = 0; h < {low.v_heads}; ++h)\n"
            "      forge_head(in, out, b, h);\n  return 0;\n}\n")


def candidate(low: ScanLowered, knobs: ScanKnobs) -> Candidate:
    """A cpu Candidate for these knobs (fast math is a compiler flag)."""
    return Candidate(CPU.name, emit_cpu(low, knobs), flags=CPU.fast_math if knobs.fast_math else CPU.exact_math)
