"""forge with torch.compile: forge's kernels where they beat Inductor's, Inductor for the rest.

`against_inductor` times each kernel of a run next to Inductor's compilation of the same region (the
task's reference source through `torch.compile`), in this process, on the same inputs, interleaved call by
call with a cache flush before each (forge's clock). `compile_with` applies the kernels that won and
compiles the patched model: under torch.compile each kernel is the opaque op `forge::kernel` (see
forge.runtime.dispatch), so Inductor compiles everything around it in one graph. Inductor may lay tensors out
otherwise than eager (channels-last around convolutions): a kernel whose guards then fail is dropped and
the model compiled again without it.

A region compiled alone is not quite what Inductor does with it inside the whole model (it may fuse the
region with its neighbours there), so the choice is per region, and the end-to-end time against plain
torch.compile is what decides whether the mix pays (benchmarks/models.py measures it).

`Compiled` is a module (forge's patched graph, or the model behind `_Call`) compiled by torch.compile, as the
variants of forge.runtime.variants run it.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from forge.bench import BenchConfig, Clock, interleaved
from forge.evaluate.domains import input_domains
from forge.evaluate.verify import generator, make_input
from forge.kernel import KernelArtifact
from forge.runtime.dispatch import GuardedKernel, OptimizedModule, apply
from forge.tasks.cut import compile_source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Duel:
    """One region: forge's kernel against Inductor's."""

    key: str
    forge_us: float
    inductor_us: float
    error: str = ""  # why forge's kernel could not be timed (then it is not kept)

    @property
    def forge_wins(self) -> bool:
        return not self.error and self.forge_us < self.inductor_us


def against_inductor(kernels: list[KernelArtifact], device: str, mode: str | None = None,
                     bench: BenchConfig | None = None) -> list[Duel]:
    """Each kernel timed beside `torch.compile(mode=mode)` of its region."""
    clock, cfg = Clock(device), bench or BenchConfig(warmup_s=0.05, budget_s=0.3)
    duels = []
    for i, k in enumerate(kernels):
        if not k.source:
            raise ValueError(f"kernel {k.key} has no reference source: read the artifact with the model "
                             "(forge.runtime.artifact.read(path, model, inputs))")
        gen = generator(device, 1000 + i)
        domains = input_domains(k.source)  # a scan's decay and rates in the rule's domain, as verified
        xs = [make_input(m, 0, gen, device, domain=domains.get(j, "")) for j, m in enumerate(k.inputs)]
        ours = GuardedKernel(k, strict=True)
        theirs = torch.compile(compile_source(k.source), mode=mode, dynamic=False)
        try:
            with torch.no_grad():
                t_ours, t_theirs = interleaved(clock, [lambda o=ours, a=xs: o(*a), lambda t=theirs, a=xs: t(*a)], cfg)
        except Exception as e:  # noqa: BLE001 - a kernel that cannot run here is simply not kept
            log.warning("forge kernel %s not timed against Inductor: %s", k.key, e)
            duels.append(Duel(k.key, float("nan"), float("nan"), str(e)[:200]))
            continue
        duels.append(Duel(k.key, t_ours.median_us, t_theirs.median_us))
        log.info("%s: forge %.1f us, Inductor %.1f us", k.key, t_ours.median_us, t_theirs.median_us)
    return duels


def compile_with(model: torch.nn.Module, inputs: list[Any], kernels: list[KernelArtifact], duels: list[Duel],
                 **compile_kw: Any) -> tuple[Any, OptimizedModule]:
    """torch.compile of `model` with the kernels that beat Inductor in place; (compiled, patched module)."""
    won = {d.key for d in duels if d.forge_wins}
    patched = apply(model, inputs, [k for k in kernels if k.key in won])
    compiled = torch.compile(patched, **compile_kw)
    with torch.no_grad():
        compiled(*inputs)  # compiles, and shows which kernels Inductor's layouts leave unused
    unused = {k for k, c in patched.counters().items() if c.fallbacks}
    if unused:
        log.warning("%d forge kernels fall back under torch.compile (%s): compiling without them", len(unused),
                    ", ".join(sorted({why for c in patched.counters().values() for why in c.fallbacks})))
        patched = apply(model, inputs, [k for k in kernels if k.key in won - unused])
        compiled = torch.compile(patched, **compile_kw)
    return compiled, patched


class _Call(torch.nn.Module):
    """The user's model behind a forward of forge's (which Compiled gives its own code object)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: Any) -> Any:
        with torch.no_grad():  # inference, as every other variant (and what was measured)
            return self.model(*inputs)


class Compiled(torch.nn.Module):
    """A module (the patched one, or the model) compiled by torch.compile, called as eager is: with Inductor's
    CUDA graphs the outputs of a call are overwritten by the next replay, so they are cloned out (as forge's
    own CUDA graph does). `counters()` are the kernels' of `opt` (they run as the op `forge::kernel` inside
    the compiled graph; none for the model itself)."""

    def __init__(self, target: torch.nn.Module, opt: OptimizedModule | None, cuda_graphs: bool) -> None:
        super().__init__()
        self.opt, self.cuda_graphs = opt, cuda_graphs
        # A forward of its own: torch.compile caches compilations on the code object, and every
        # OptimizedModule shares one, so a process that compiled eight of them would hit Dynamo's recompile
        # limit and run the ninth uncompiled.
        f = type(target).forward
        target.forward = types.MethodType(types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__,
                                                             f.__defaults__, f.__closure__), target)
        self.target = target
        self.compiled = torch.compile(target, mode="reduce-overhead" if cuda_graphs else None, dynamic=False)

    def forward(self, *inputs: Any) -> Any:
        out = self.compiled(*inputs)
        if self.cuda_graphs:
            out = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
        return out

    def counters(self) -> dict[str, Any]:
        """Per task key: hits and fallbacks (by reason) of the kernels inside."""
        return self.opt.counters() if self.opt is not None else {}
