"""Variants of an optimized model, each measured end to end; the fastest one is forge's result.

A variant is which found kernels it uses (all, or none), which whole-graph rewrites it applies
(forge.runtime.rewrites) and how the forward runs (RUNTIMES):
- `graph`: the patched ATen graph run op by op from Python;
- `cuda-graph`: the same forward captured once as a CUDA graph and replayed (forge.runtime.graphs.GraphReplay);
- `inductor`: the patched, rewritten graph compiled by torch.compile (forge's kernels are the opaque op
  `forge::kernel` in it); with no kernels and no rewrites, the user's model itself ("model, inductor":
  exactly what torch.compile(model) gives, so forge's result is never a worse compile than that);
- `inductor-cuda-graph`: the same with `mode="reduce-overhead"` (Inductor's CUDA graphs).
Block-wise (`blocks`: forge.runtime.blockwise), `inductor` compiles each kind of block's patched graph once (with
kernels or none), and `inductor-cuda-graph` replays that forward as one CUDA graph of forge's, not Inductor's.

`choose` decides greedily, every variant measured on the whole forward against eager (interleaved in this
process, outputs compared on fresh inputs), two chains: without the found kernels and with them. Each
starts on a runtime without compilation (on CUDA the faster of the CUDA graph and the graph; Inductor's
CUDA graphs or not follow that choice); each rewrite that applies is added and
kept only if the forward got faster by more than the timing noise, outputs matching; one that is not kept
is tried again together with the rewrites that make its sites (`Rewrite.after`: cuDNN's fused ReLU needs
the BatchNorm folded first, and folding alone may not pay) where the chain did not keep those. Then, when allowed and
time is left, the end of each chain is compiled by Inductor, the chain without kernels first, with the
rewrites that pay only compiled (`Rewrite.pays_compiled`: attention as GEMMs around a softmax, whose
passes Inductor fuses) added where they applied; then the chain ends without them, time permitting.
The first compiled is always the model itself (torch.compile's result, the floor); forge optimize on a GPU
measures it, and the chain without kernels compiled, before the search (`measure_floor`).
A compiled variant whose kernels fell back to eager (Inductor handed them another layout than the one
they were verified for, as it does the SD3.5 VAE's GroupNorms) is not what it says and fails; it is tried
again without those kernels (`Variant.without`, "kernels (less N)"), as long as any are left and time
permits.
Variants are compared by their own times, not by their ratios to eager: a launch-bound eager forward varies
far more between measurements (4.3 to 7.5 ms for ResNet-50 bf16 on an H200, in one run) than a replayed
graph does. A variant that fails to build or run, or whose forward's peak device memory is above MAX_PEAK times
eager's, is recorded with its error and not kept.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from forge.capture.export import Capture, capture
from forge.kernel import KernelArtifact
from forge.runtime.blockwise import BlockwiseModule, apply_blockwise
from forge.runtime.compiled import Compiled, _Call
from forge.runtime.dispatch import OptimizedModule, _views_to_reshapes, apply
from forge.runtime.endtoend import fresh_inputs, interleaved_ms, outputs_match
from forge.runtime.endtoend import peak_ratio as _peak_ratio  # a module name: tests replace it
from forge.runtime.result import ForgeModel
from forge.runtime.rewrites import REWRITES, parse, rewrite

log = logging.getLogger(__name__)

RUNTIMES = ("graph", "cuda-graph", "inductor", "inductor-cuda-graph")
GAIN = 0.99  # a step is kept when it takes the forward under 99% of the best time so far (noise is ~0.5%)
# A variant whose forward's peak device memory is above this times eager's is not a result (issue 12): merging
# Gemma 4's linears compiled was 2.7% faster at 1.41x eager's peak on an H100 (2026-12-06)
MAX_PEAK = 1.2


@dataclass(frozen=True)
class Variant:
    """What a result is made of: found kernels or not, rewrites, runtime."""

    kernels: bool = True
    rewrites: tuple[str, ...] = ()
    runtime: str = "graph"
    without: tuple[str, ...] = ()  # task keys of found kernels left out (they fell back under Inductor)
    blocks: bool = False  # the kernels applied block by block (forge.runtime.blockwise), the glue eager

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"Invalid runtime {self.runtime!r}: choose from {', '.join(RUNTIMES)}")
        if self.blocks and (self.rewrites or not (self.kernels or self.runtime.startswith("inductor"))):
            raise ValueError("Invalid variant: block-wise dispatch takes no rewrites, and kernels or Inductor")
        object.__setattr__(self, "rewrites", parse(self.rewrites))
        object.__setattr__(self, "without", tuple(sorted(self.without)))

    @property
    def own_model(self) -> bool:
        """Inductor with nothing of forge's: the user's model itself is compiled (what torch.compile does)."""
        return not self.kernels and not self.rewrites and self.runtime.startswith("inductor") and not self.blocks

    @property
    def name(self) -> str:
        """Human-readable, e.g. 'kernels + fold-bn + channels-last, cuda-graph' or 'model, inductor'."""
        kernels = f"kernels (less {len(self.without)})" if self.without else "kernels"
        parts = ([kernels] if self.kernels else []) + list(self.rewrites)
        name = f"{' + '.join(parts) or ('model' if self.own_model or self.blocks else 'eager graph')}, {self.runtime}"
        return f"{name}, block-wise" if self.blocks else name

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form."""
        return {"kernels": self.kernels, "rewrites": list(self.rewrites), "runtime": self.runtime,
                "without": list(self.without), "blocks": self.blocks, "name": self.name}

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Variant:
        """Inverse of to_json; ValueError on a malformed entry."""
        try:
            kernels, rewrites, runtime = d["kernels"], tuple(d["rewrites"]), str(d["runtime"])
            without, blocks = tuple(str(k) for k in d.get("without", ())), d.get("blocks", False)
        except (KeyError, TypeError) as e:
            raise ValueError(f"Invalid variant: {d!r}") from e
        if not isinstance(kernels, bool) or not isinstance(blocks, bool):
            raise ValueError(f"Invalid variant (kernels and blocks must be true or false): {d!r}")
        return cls(kernels, rewrites, runtime, without, blocks)


TRIVIAL = Variant(False, (), "graph")  # the captured graph run as it is: eager by another name


@dataclass(frozen=True)
class Measured:
    """One variant measured against eager in the same interleaved run."""

    variant: Variant
    eager_ms: float
    ms: float
    match: bool
    max_rel_err: float
    peak_mem_ratio: float | None  # peak device memory of a forward over eager's (CUDA only)
    sites: dict[str, int] = field(default_factory=dict)  # rewrites: sites rewritten; block-wise: blocks, kinds
    error: str = ""
    fell: tuple[str, ...] = ()  # task keys of kernels that fell back to eager (the variant then failed)

    @property
    def ratio(self) -> float:
        """Variant time over eager time (lower is better); inf when it failed."""
        return self.ms / self.eager_ms if self.ok else float("inf")

    @property
    def ok(self) -> bool:
        return not self.error and self.match and self.ms > 0

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form."""
        return {"variant": self.variant.to_json(), "eager_ms": self.eager_ms, "ms": self.ms, "match": self.match,
                "max_rel_err": self.max_rel_err, "peak_mem_ratio": self.peak_mem_ratio, "sites": self.sites,
                "error": self.error}


def build(model: torch.nn.Module, inputs: list[Any], kernels: list[KernelArtifact], variant: Variant,
          device: str, strict: bool = False, cap: Capture | None = None
          ) -> tuple[Callable[..., Any], OptimizedModule | BlockwiseModule | None, dict[str, int]]:
    """The model as `variant`: (callable, the patched module under it or None for the model itself, sites
    rewritten per rewrite). `cap`: the model's capture on these inputs, when there is one already (see
    forge.runtime.dispatch.apply)."""
    if variant.blocks:
        used = [k for k in kernels if k.key not in variant.without]
        used = used if variant.kernels else []
        bw = apply_blockwise(model, inputs, used, strict=strict, compile=variant.runtime.startswith("inductor"),
                             cuda_graph=variant.runtime in ("cuda-graph", "inductor-cuda-graph"))
        if bw is None:
            raise RuntimeError("the model has no repeated blocks to dispatch block-wise")
        return ForgeModel(bw, model, bw, None, derived=False), bw, {"blocks": bw.blocks, "kinds": bw.kinds}
    if variant.own_model:  # nothing of forge's in it: the model itself, as torch.compile(model) would (the
        # captured graph, with parameters as inputs, compiled measurably slower than that on some CPU problems);
        # Dynamo's guards see a replaced parameter
        own = Compiled(_Call(model), None, variant.runtime == "inductor-cuda-graph")
        return ForgeModel(own, model, None, lambda: True, derived=False), None, {}
    used = [k for k in kernels if k.key not in variant.without] if variant.kernels else []
    opt = apply(model, inputs, used, strict=strict,
                cuda_graph=variant.runtime == "cuda-graph", cap=cap)
    sites: dict[str, int] = {}
    if variant.rewrites:  # rewritten layouts (slices, NHWC) may not take a view: reshapes, then one recompile
        _views_to_reshapes(opt.gm.graph)
        sites = rewrite(opt.gm, opt._template, opt._user_slots, variant.rewrites, device)
    derived = bool(variant.rewrites) or opt._state is None  # folded, merged or relaid-out copies of weights
    if variant.runtime.startswith("inductor"):
        return ForgeModel(Compiled(opt, opt, variant.runtime == "inductor-cuda-graph"), model, opt, None,
                          derived), opt, sites
    return ForgeModel(opt, model, opt, None if variant.rewrites else opt.reread, derived), opt, sites


def measure(model: torch.nn.Module, inputs: list[Any], kernels: list[KernelArtifact], variant: Variant,
            device: str, cap: Capture | None = None, need: str = "") -> tuple[Measured, Callable[..., Any] | None]:
    """Build `variant` and time it against eager; (measurement, the callable or None when it failed).
    `need`: a rewrite that must have rewritten something, else the variant is not timed."""
    gc.collect()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved() if cuda else 0
    start = time.monotonic()
    try:
        fn, opt, sites = build(model, inputs, kernels, variant, device, cap=cap)
        if need and not sites.get(need):
            return Measured(variant, 0.0, 0.0, False, float("inf"), None, sites, f"{need}: nothing to rewrite"), None
        eager_ms, ms = interleaved_ms(lambda: model(*inputs), lambda: fn(*inputs), device)
        replayed = variant.runtime == "cuda-graph" or (variant.blocks and variant.runtime == "inductor-cuda-graph")
        if replayed and opt is not None and not opt.cuda_graph:  # forge's own graph: it must have been captured
            raise RuntimeError(f"not capturable as a CUDA graph: {opt.graph_error}")
        match, err = outputs_match(model, fn, fresh_inputs(inputs))
        peak = _peak_ratio(fn, model, inputs, base)
        if isinstance(opt, BlockwiseModule):
            opt.check_patched(variant.kernels)
        fell = {k: c for k, c in (opt.counters() if opt else {}).items() if c.fallbacks}
        if fell:  # a rewrite or a compiler changed a kernel's input layout: the variant is not what it says
            raise _FellBack(tuple(sorted(fell)), f"{len(fell)} kernels fall back to eager: " + "; ".join(
                f"{k} ({', '.join(c.fallbacks)})" for k, c in sorted(fell.items())))
    except Exception as e:  # noqa: BLE001 - a variant that cannot be built or run is a result, not a crash
        log.warning("variant %s failed: %s: %s", variant.name, type(e).__name__, e)
        return Measured(variant, 0.0, 0.0, False, float("inf"), None, {}, f"{type(e).__name__}: {e}"[:300],
                        e.keys if isinstance(e, _FellBack) else ()), None
    log.info("variant %s: %.3f ms against eager %.3f (%.2fx), match %s, peak memory %s, %.1f s", variant.name, ms,
             eager_ms, eager_ms / ms if ms else 0.0, match, f"{peak:.2f}x" if peak else "-", time.monotonic() - start)
    over = f"peak memory {peak:.2f}x eager's, above {MAX_PEAK}x" if peak and peak > MAX_PEAK else ""
    return Measured(variant, eager_ms, ms, match, err, peak, sites, over), fn


class _FellBack(RuntimeError):
    """Kernels of a variant fell back to eager (their keys)."""

    def __init__(self, keys: tuple[str, ...], message: str) -> None:
        super().__init__(message[:300])
        self.keys = keys


def _greedy(run: Callable[..., Measured], kernels: bool, names: tuple[str, ...], cuda: bool
            ) -> tuple[Measured, tuple[str, ...], str]:
    """Rewrites added one at a time on the runtime without compilation, each kept if the forward got faster;
    (the best, the rewrites that pay only compiled (Rewrite.pays_compiled) which rewrote something with
    outputs matching but were not kept: the compiled stage judges them again, the compiled runtime)."""
    best, runtime = first_step(run, kernels, cuda)
    later: list[str] = []
    for name in names:
        m = run(replace(best.variant, rewrites=(*best.variant.rewrites, name)), need=name)
        missing = [a for a in REWRITES[name].after if a in names and a not in best.variant.rewrites]
        if missing and not (m.ok and time_of(m) < time_of(best) * GAIN):  # with what makes its sites, not kept alone
            both = run(replace(best.variant, rewrites=(*best.variant.rewrites, *missing, name)), need=name)
            if all(both.sites.get(a) for a in missing):  # else the same graph as alone, timed a second time
                m = min(m, both, key=time_of)
        if m.ok and time_of(m) < time_of(best) * GAIN:
            best = m
        elif m.ok and REWRITES[name].pays_compiled:
            later.append(name)
    return best, tuple(later), runtime


def first_step(run: Callable[..., Measured], kernels: bool, cuda: bool, blocks: bool = False) -> tuple[Measured, str]:
    """A chain's first step and the runtime its compiled end will have. On CUDA both runtimes are measured:
    the CUDA graph (no launches) is kept unless the graph run op by op is faster by more than the noise, as
    it is where copying the inputs into the graph's own buffers costs more than the launches save
    (KernelBench's MSE loss of two 4 GiB inputs on the H200: reduce-overhead 0.88x eager, torch.compile's
    default 3.08x); then Inductor runs without CUDA graphs too. A forward forge cannot capture still gets
    Inductor's CUDA graphs (they leave out what they cannot capture)."""
    if not cuda:
        return run(Variant(kernels, (), "graph", blocks=blocks)), "inductor"
    replayed = run(Variant(kernels, (), "cuda-graph", blocks=blocks))
    plain = run(Variant(kernels, (), "graph", blocks=blocks))
    if replayed.ok and time_of(plain) < time_of(replayed) * GAIN:
        return plain, "inductor"
    return (replayed if replayed.ok else min(plain, replayed, key=time_of)), "inductor-cuda-graph"


def time_of(m: Measured) -> float:
    """What variants are compared by: their own median (inf when they failed)."""
    return m.ms if m.ok else float("inf")


def may_compile(now: float, last: float, deadline: float | None, finish: float | None) -> bool:
    """Whether another compilation starts. The first always does: it is the floor torch.compile sets (on
    KernelBench level 2's conv + HardSwish + MaxPool + Mish on the H200 a 35-s budget spent on capture and
    search left it no time, and forge kept eager at 1.00x where torch.compile made 2.14x). Later ones start
    while the last one's time still fits before `finish`, or before `deadline` when there is no `finish`
    (on the SD3.5 VAE the deadline alone once stopped the second compilation, the one that had won at
    ee775a5, with time for it left before `finish`)."""
    if last <= 0:
        return True
    if finish is not None:
        return now + last <= finish
    return deadline is None or now <= deadline


@dataclass(frozen=True)
class Ahead:
    """What forge optimize measures on a GPU before the search (measure_floor): every measurement made, the
    seconds the floor's compilation (with its timing) took, and the seconds the chain without kernels took."""

    tried: tuple[Measured, ...] = ()
    compile_s: float = 0.0
    chain_s: float = 0.0


def measure_floor(model: torch.nn.Module, inputs: list[Any], device: str, cap: Capture | None = None,
                  rewrites: tuple[str, ...] | None = None, finish: float | None = None) -> Ahead:
    """What needs no found kernel, measured ahead of the search: the chain without kernels (uncompiled; choose
    does not measure it again), what torch.compile makes of the model (choose's floor, on the runtime that
    chain's compiled end has), then that chain's compiled end (choose's next compilation) where it is not the
    floor and, judged by the floor's time, ends before `finish` less the chain's time (the chain with the found
    kernels, after the search, takes about as long). Ahead: a reference model's compilation takes
    about a minute on an H200's host, and after the search the second did not fit in 300 s (0d9eb0b, dda6433,
    0ea6aef): the result was torch.compile's own where the chain without kernels compiled had made 1.07-1.12x
    the faster torch.compile (SD3.5 MMDiT at 5a9cce5, Gemma 4 at 44e84b0)."""
    cap = cap or capture(model, inputs)
    tried: list[Measured] = []

    def run(v: Variant, need: str = "") -> Measured:
        tried.append(measure(model, inputs, [], v, device, cap, need)[0])
        return tried[-1]

    start = time.monotonic()
    head = _greedy(run, False, _names(rewrites, device), device.startswith("cuda"))
    chained = time.monotonic()
    floor = run(Variant(False, (), head[2])).variant
    seconds = time.monotonic() - chained
    room = None if finish is None else finish - (chained - start)
    if _compiled_end(*head) != floor and may_compile(time.monotonic(), seconds, None, room):
        run(_compiled_end(*head))
    return Ahead(tuple(tried), seconds, chained - start)


def _compiled_end(head: Measured, later: tuple[str, ...], runtime: str) -> Variant:
    """A chain's end (_greedy's answer) compiled, with the rewrites that pay only compiled added."""
    return replace(head.variant, rewrites=parse((*head.variant.rewrites, *later)), runtime=runtime)


def _names(rewrites: tuple[str, ...] | None, device: str) -> tuple[str, ...]:
    """The rewrites a chain tries: `rewrites`, or every one in REWRITES that applies to the device."""
    return parse(rewrites if rewrites is not None else tuple(n for n, r in REWRITES.items() if r.applies_to(device)))


def choose(model: torch.nn.Module, inputs: list[Any], kernels: list[KernelArtifact], device: str, *,
           compile: bool = True, deadline: float | None = None, finish: float | None = None,
           rewrites: tuple[str, ...] | None = None, cap: Capture | None = None,
           ahead: Ahead | None = None) -> tuple[Measured, list[Measured]]:
    """The fastest variant measured (greedy, see the module docstring) and every measurement made.

    `rewrites`: the rewrites to try (default: every one in forge.runtime.rewrites.REWRITES that applies to the
    device); `deadline` (time.monotonic()): no Inductor compilation but the first (the model itself) is started
    after it; `finish`: nor one that would end after it, judged by the last compilation's time (may_compile).
    `cap`: the model's capture on `inputs` (in the layout its kernels were found for, forge.capture.layout),
    when the caller has it. `ahead`: measure_floor's result, when it ran: those variants are not measured
    again (the chain without kernels comes out the same), and the first compilation here is judged by the
    floor's time.
    """
    cuda = device.startswith("cuda")
    tried: list[Measured] = []
    cap = cap or capture(model, inputs)  # once: every variant starts from a copy of it
    ahead = ahead or Ahead()
    known = {m.variant: m for m in ahead.tried}

    def run(v: Variant, need: str = "") -> Measured:
        m = known.pop(v, None) or measure(model, inputs, kernels, v, device, cap, need)[0]
        tried.append(m)
        return m

    names = _names(rewrites, device)
    # One greedy chain without the kernels (a rewrite then reaches every site) and one with them: a kernel
    # that swallows a BatchNorm leaves nothing to fold, so the chains end in different places.
    heads = [_greedy(run, False, names, cuda)] + ([_greedy(run, True, names, cuda)] if kernels else [])
    best = min((h for h, _, _ in heads), key=time_of)
    # Compiled, most promising first (a deadline may stop them): the chain without the kernels first (Inductor
    # fuses what they do: on the H200 the kernels inside Inductor won by 1.6% on Gemma 4, lost by 11% on the
    # SD3.5 MMDiT and fell back on the VAE), each head with the rewrites that pay only compiled, then the
    # heads as they are where that differs.
    compiled = [_compiled_end(*h) for h in heads]
    compiled += [replace(h.variant, runtime=runtime) for h, later, runtime in heads if later]
    # first of all the model itself compiled, torch.compile's result: the floor may_compile always gives time
    # to (on the H200, KernelBench L2 57's chain kept cudnn-epilogue, whose opaque fused convolution kept
    # Inductor from its NHWC TF32 one: 2.25x where torch.compile alone made 2.80x)
    floor = Variant(False, (), heads[0][2])
    compiled = [floor, *(v for v in compiled if v != floor)]
    last = ahead.compile_s  # seconds the last compilation took (with its timing)
    queue = compiled if compile else []
    while queue:
        v = queue.pop(0)
        now, measured = time.monotonic(), v in known
        if not measured and not may_compile(now, last, deadline, finish):
            break
        m = run(v)  # a failed head is compiled too: Inductor may run it
        last = last if measured else time.monotonic() - now
        # Inductor gave some kernels another layout: next, the variant without them (dropping some moves
        # Inductor's layout choices for others: on the SD3.5 VAE 2 fell back, then 3 more), while any are left
        without = tuple(sorted({*v.without, *m.fell}))
        if m.fell and len(without) < len(kernels):
            queue.insert(0, replace(v, without=without))
    # the fastest that ran, of the variants that are something other than eager by another name
    return min((m for m in tried if m.ok and m.variant != TRIVIAL), key=time_of, default=best), tried

