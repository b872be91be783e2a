"""Guarded dispatch: the captured graph with winning kernels in place of their regions.

`apply(model, inputs, kernels)` captures the model as forge.capture.export does, finds every occurrence of
each task key (forge.tasks.cut), and swaps the region's nodes for one call of a `GuardedKernel`. At run
time the kernel runs only when its guards hold: device type, dtype, shape and stride of every input,
and no autograd (inference only); otherwise, or when the kernel fails, the region's eager reference
runs instead and the fallback is counted (`strict=True` raises instead). Counters are per kernel. Inputs in
another layout than verified (a kernel upstream writes row-major what eager leaves a transposed view, say) are
copied into the verified one and the kernel runs (counted as `relaid`), where that layout has no overlap.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind

from forge.backends import BACKENDS
from forge.capture.export import Capture, capture
from forge.evaluate.launch import Launcher, LaunchError, call_on
from forge.kernel import KernelArtifact
from forge.runtime.graphs import GraphReplay
from forge.runtime.rewrite_base import stable_toposort
from forge.tasks.cut import Task, build_tasks, compile_source, region_source

log = logging.getLogger(__name__)


@dataclass
class Counters:
    """How often a kernel ran (`relaid`: of those, runs on copies of inputs that came in another layout than
    the verified one), and why it did not."""

    hits: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    relaid: int = 0


# looked up once: a guarded call runs on every call of every kernel
_is_compiling, _grad_enabled, _empty_like = torch.compiler.is_compiling, torch.is_grad_enabled, torch.empty_like

# Every GuardedKernel by number, for the custom op `forge::kernel` through which torch.compile calls them.
_KERNELS: list[weakref.ref[GuardedKernel]] = []


def _kernel(number: int) -> GuardedKernel:
    g = _KERNELS[number]()
    if g is None:
        raise RuntimeError(f"forge kernel #{number} no longer exists")
    return g


def _kernel_op(kernel: int, args: list[torch.Tensor]) -> list[torch.Tensor]:
    """A guarded kernel as one opaque operator: what torch.compile puts in its graph for a forge region."""
    g = _kernel(kernel)
    hits = g.counters.hits
    if len(args) == len(g._signature) and all((a.dtype, a.shape, a.stride(), a.is_cuda, a.is_cpu) == sig
                                              for a, sig in zip(args, g._signature)):  # noqa: B905 - checked
        outs = g.forward(*args)
        if g.counters.hits > hits:  # the kernel ran: its outputs are fresh, in the verified layout
            return list(outs)
    elif g._guard(tuple(args)) == "stride":  # Inductor chose another layout (channels-last, say) than eager's
        g.counters.fallbacks["stride under torch.compile"] += 1
        outs = g.reference(*[a.contiguous() for a in args])  # some eager ops take row-major inputs only
    else:
        outs = g.forward(*args)
    fixed = []
    for o, (shape, stride, dtype, _) in zip(outs, g._outputs_like, strict=True):
        # the eager fallback may return another layout, or a view of an input: the op promises fresh
        # tensors of the verified layout (what _kernel_fake told the compiler)
        if o.stride() != stride or o.dtype is not dtype or any(o.untyped_storage().data_ptr() ==
                                                              a.untyped_storage().data_ptr() for a in args):
            o = torch.empty_strided(shape, stride, dtype=dtype, device=o.device).copy_(o)
        fixed.append(o)
    return fixed


def _kernel_fake(kernel: int, args: list[torch.Tensor]) -> list[torch.Tensor]:
    g = _kernel(kernel)
    device = args[0].device if args else torch.device(g.device_type)
    return [torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for shape, stride, dtype, _ in g._outputs_like]


# Defined with torch.library.Library rather than the custom_op decorator: a call costs about 5 us over the
# guarded call instead of 13 (measured on the CPU), and forge's kernels are for inference only anyway.
_LIB = torch.library.Library("forge", "DEF")
_LIB.define("kernel(int kernel, Tensor[] args) -> Tensor[]")
_LIB.impl("kernel", _kernel_op, "CompositeExplicitAutograd")
torch.library.register_fake("forge::kernel", _kernel_fake, lib=_LIB)


class GuardedKernel(torch.nn.Module):
    """Calls a kernel when the inputs are what it was verified for; the eager reference otherwise.

    Under torch.compile the call is the custom op `forge::kernel` (opaque to Dynamo and Inductor, which
    compile what lies around it) rather than a graph break.
    """

    def __init__(self, art: KernelArtifact, strict: bool = False) -> None:
        super().__init__()
        self.art, self.strict = art, strict
        self.number = len(_KERNELS)
        _KERNELS.append(weakref.ref(self))
        self.reference = compile_source(art.source)
        self.launch: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None] | None = None
        self.counters = Counters()
        self.device_type = BACKENDS[art.backend].device
        # the guards and outputs, precomputed: a guarded call costs a few microseconds over a bare launch
        # per output: shape, strides, dtype, and an input of that layout (empty_like(input) is cheaper than
        # empty_strided, and the guards make the input's layout the verified one), or None
        outputs = [(m.shape, m.written().stride, m.torch_dtype) for m in art.outputs]
        self._outputs_like = tuple((*o, next((i for i, m in enumerate(art.inputs) if (m.shape, m.stride,
                                   m.torch_dtype) == o), None)) for o in outputs)
        self._cuda = self.device_type == "cuda"
        self._signature = [(m.torch_dtype, m.shape, m.stride, self._cuda, not self._cuda) for m in art.inputs]
        self._relayable = all(m.non_overlapping for m in art.inputs)

    def _guard(self, args: tuple[Any, ...]) -> str | None:
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return "autograd"
        if len(args) != len(self._signature):
            return "arity"
        cuda = self._cuda
        for a, (dtype, shape, stride, _, _) in zip(args, self._signature, strict=True):
            if not isinstance(a, torch.Tensor) or not (a.is_cuda if cuda else a.is_cpu):
                return "device"
            if a.dtype is not dtype:
                return "dtype"
            if a.shape != shape:
                return "shape"
            if a.stride() != stride:
                return "stride"
        return None

    def _relaid(self, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        """Copies in the verified layout of inputs that came in another (a kernel upstream writes row-major what
        eager leaves a transposed view, say): the kernel runs on what it was verified for, the copies' cost in
        every end-to-end timing of the variant."""
        out = []
        for a, (dtype, shape, stride, _, _) in zip(args, self._signature, strict=True):
            if a.stride() != stride:
                a = torch.empty_strided(shape, stride, dtype=dtype, device=a.device).copy_(a)
            out.append(a)
        if not self.counters.relaid:
            log.info("forge kernel %s: an input came in another layout than verified; it runs on copies", self.art.key)
        self.counters.relaid += 1
        return tuple(out)

    def _fallback(self, why: str, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        if self.strict:
            raise RuntimeError(f"forge kernel {self.art.key} did not run: {why}")
        self.counters.fallbacks[why] += 1
        return tuple(self.reference(*args))

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        if _is_compiling():
            return tuple(torch.ops.forge.kernel(self.number, list(args)))
        # Every guard in one comparison per input on the path that passes them (_guard names the first that
        # fails), and plain loops rather than comprehensions: this runs on every call of every kernel.
        passed = not _grad_enabled() and len(args) == len(self._signature)
        if passed:
            try:
                for a, sig in zip(args, self._signature):  # noqa: B905 - lengths checked above
                    if (a.dtype, a.shape, a.stride(), a.is_cuda, a.is_cpu) != sig:
                        passed = False
                        break
            except (AttributeError, TypeError):  # not a tensor
                passed = False
        if not passed:
            why = self._guard(args)
            if why == "stride" and self._relayable:
                args = self._relaid(args)
            elif why is not None:
                return self._fallback(why, args)
        outs = []
        for shape, stride, dtype, like in self._outputs_like:  # in the layout verification had them in
            if like is not None:  # an input of this layout: empty_like is the cheapest allocation
                outs.append(_empty_like(args[like]))
            elif self._cuda:
                outs.append(torch.empty_strided(shape, stride, dtype=dtype, device=args[0].device if args
                                                else torch.device("cuda")))
            else:
                outs.append(torch.empty_strided(shape, stride, dtype=dtype))
        try:
            if self.launch is None:
                self.launch = _launch_of(self.art)
            self.launch(args, outs)
        except (LaunchError, OSError, RuntimeError) as e:
            if self.strict:
                raise
            log.warning("forge kernel %s failed, running eager: %s", self.art.key, e)
            return self._fallback("error", args)
        self.counters.hits += 1
        return tuple(outs)

    # Called straight, not through nn.Module.__call__ (its hook machinery costs about a microsecond a call):
    # the patched graph calls every kernel on every forward. Module hooks on a GuardedKernel do not run.
    __call__ = forward


def _launch_of(art: KernelArtifact) -> Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]:
    """The kernel as a call on (inputs, outputs): fixed ForgeTensor arrays for C/CUDA, the module for Triton."""
    return call_on(Launcher(art.backend, art.path, art.entry), art.inputs, art.outputs)


class GuardedForward(torch.nn.Module):
    """A model's forward specialised to the inputs it was built on: calls with other inputs (shapes, dtypes,
    devices) run the original model and are counted (`model_fallbacks`); with `cuda_graph` (CUDA only) the
    first call captures `_run` as a CUDA graph and later calls replay it (GraphReplay), and a forward that
    cannot be captured goes on without a graph (`graph_error` says why). Subclasses give `_run`."""

    def __init__(self, original: torch.nn.Module, inputs: list[Any], cuda_graph: bool) -> None:
        super().__init__()
        self.original = original
        self._signature = [_sig(x) for x in inputs]
        self.model_fallbacks = 0  # calls whose inputs differ from the captured ones: the whole model ran eager
        self.cuda_graph = cuda_graph and any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
        self.graph_error = ""
        self._replay: GraphReplay | None = None

    def forward(self, *inputs: Any) -> Any:
        if [_sig(x) for x in inputs] != self._signature:  # the graph is specialised to the captured inputs
            self.model_fallbacks += 1
            return self.original(*inputs)
        if self.cuda_graph and not _is_compiling():
            if self._replay is None:
                try:
                    self._replay = GraphReplay(self._run, list(inputs))
                except Exception as e:  # noqa: BLE001 - any capture failure: run without a graph
                    self.cuda_graph, self.graph_error = False, f"{type(e).__name__}: {e}"[:300]
                    log.warning("forge: no CUDA graph for this model (%s); running without", self.graph_error)
                    return self._run(*inputs)
            return self._replay(*inputs)
        return self._run(*inputs)

    def _run(self, *inputs: Any) -> Any:
        raise NotImplementedError


class OptimizedModule(GuardedForward):
    """The captured model with guarded kernels; `counters()` reports hits and fallbacks per task key.

    With `cuda_graph` the whole patched forward is replayed as a CUDA graph (GuardedForward): the kernels'
    guards are checked while capturing, and the captured inputs' shapes, dtypes and devices are checked on
    every call as without it."""

    def __init__(self, gm: torch.fx.GraphModule, template: list[Any], user_slots: list[int],
                 kernels: dict[str, GuardedKernel], original: torch.nn.Module, inputs: list[Any],
                 cuda_graph: bool = False, out_spec: pytree.TreeSpec | None = None,
                 state: dict[str, int] | None = None,
                 updates: tuple[tuple[tuple[int, int], ...], tuple[int, ...]] | None = None) -> None:
        super().__init__(original, inputs, cuda_graph)
        self.gm, self.kernels = gm, kernels
        self._template, self._user_slots = template, user_slots
        self._out_spec = out_spec  # the structure the model returns (its export's), when known
        self._state = state  # the model's parameters and buffers by name -> their slots; None: not all its own
        self._updates, self._users = updates or ((), ())  # buffers the forward changes (Capture.state_updates)

    def reread(self) -> bool:
        """Take the model's current parameters and buffers into the graph's arguments (after one was replaced;
        a CUDA graph is captured again); False where the graph holds copies of them (another layout) or a new
        one differs in shape, dtype, device or strides."""
        if self._state is None:
            return False
        now = _state_of(self.original)
        new = {slot: now.get(name) for name, slot in self._state.items()}
        if not all(isinstance(t, torch.Tensor) and _sig(t) == _sig(self._template[slot]) and
                   t.stride() == self._template[slot].stride() for slot, t in new.items()):
            return False
        for slot, t in new.items():
            self._template[slot] = t
        self._replay = None
        return True

    def _run(self, *inputs: Any) -> Any:
        args = list(self._template)
        for slot, x in zip(self._user_slots, inputs, strict=True):
            args[slot] = x
        with torch.no_grad():
            out = self.gm(*args)
            if self._updates:  # written back in place, as eager changes them (training-mode running statistics)
                for j, slot in self._updates:
                    args[slot].copy_(out[j])
                out = tuple(out[j] for j in self._users)
        flat = list(out) if isinstance(out, (tuple, list)) else [out]
        if self._out_spec is not None and self._out_spec.num_leaves == len(flat):
            return pytree.tree_unflatten(flat, self._out_spec)  # a 1-tuple stays a 1-tuple, a dict a dict
        return out[0] if isinstance(out, (tuple, list)) and len(out) == 1 else out

    def counters(self) -> dict[str, Counters]:
        """Per task key: hits and fallbacks (by reason)."""
        return {k: g.counters for k, g in self.kernels.items()}


def apply(model: torch.nn.Module, inputs: list[Any], kernels: list[KernelArtifact], strict: bool = False,
          cuda_graph: bool = False, cap: Capture | None = None) -> OptimizedModule:
    """Capture `model` on `inputs` and replace every region whose task key has a kernel; `cuda_graph`:
    replay the patched forward as one CUDA graph (see OptimizedModule). `cap`: a capture of the same model
    and inputs to start from (copied, not changed), instead of capturing again."""
    cap = capture(model, inputs) if cap is None else cap
    gm = _copy(cap.graph_module)
    graph = gm.graph
    by_key = {k.key: k for k in kernels}
    tasks: list[Task] = [t for t in build_tasks(graph) if t.key in by_key]
    # the fallback is the region of the model being patched, never source text that came with the kernel
    guarded = {t.key: GuardedKernel(replace(by_key[t.key], source=t.source), strict) for t in tasks}
    names = {}
    for i, t in enumerate(tasks):
        names[t.key] = f"forge_kernel_{i}"
        gm.add_submodule(names[t.key], guarded[t.key])
    nodes = {n.name: n for n in graph.nodes}
    for t in tasks:
        for occ in t.occurrences:
            region = [nodes[name] for name in occ]
            r = region_source(region)
            last = region[-1]
            with graph.inserting_before(last):
                call = graph.call_module(names[t.key], tuple(nodes[i] for i in r.input_nodes))
                outs = [graph.call_function(_item, (call, j)) for j in range(len(r.output_nodes))]
            nodes.update({n.name: n for n in (call, *outs)})  # a later region may read these outputs
            for name, new in zip(r.output_nodes, outs, strict=True):
                new.meta = dict(nodes[name].meta)
                nodes[name].replace_all_uses_with(new, delete_user_cb=lambda u, ms=set(region): u not in ms)
            for n in reversed(region):
                for u in list(n.users):  # runtime asserts on region values go with the region
                    if u not in region and u.op == "call_function" and not u.users:
                        graph.erase_node(u)
                graph.erase_node(n)
    if tasks:
        _views_to_reshapes(graph)
    new_graph = stable_toposort(graph)
    patched = torch.fx.GraphModule(gm, new_graph)
    patched.recompile()
    marks = [object() for _ in inputs]
    template = cap.flat_args(marks)
    slots = [next(i for i, a in enumerate(template) if a is m) for m in marks]
    return OptimizedModule(patched, template, slots, guarded, model, inputs, cuda_graph=cuda_graph,
                           out_spec=cap.exported.call_spec.out_spec, state=_own_state(cap, model, template),
                           updates=cap.state_updates())


def _state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}


def _own_state(cap: Capture, model: torch.nn.Module, template: list[Any]) -> dict[str, int] | None:
    """Each parameter and buffer of the graph by name -> its slot in `template`; None unless every one is the
    model's own tensor (not a copy in another layout)."""
    own, state = _state_of(model), {}
    for slot, spec in enumerate(cap.exported.graph_signature.input_specs):
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            if own.get(str(spec.target)) is not template[slot]:
                return None
            state[str(spec.target)] = slot
    return state


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A graph module with its own copy of `gm`'s graph (node metadata shared): patching it leaves `gm` as is."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _views_to_reshapes(graph: torch.fx.Graph) -> None:
    """Kernels write their outputs row-major, where eager may have had another layout (a permuted one,
    say), and ops downstream (attention, for one) may then lay out their own outputs differently too: a
    `view` that relied on eager's strides may not apply to the new ones. Every view becomes a `reshape`
    (the same view where one applies, a copy where none does)."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _VIEWS:
            node.target = torch.ops.aten.reshape.default


def _sig(x: Any) -> Any:
    """What the captured graph is specialised to: device, dtype and shape of a tensor, else the value."""
    if isinstance(x, torch.Tensor):
        return (x.device.type, x.dtype, tuple(x.shape))
    return x


def _item(t: tuple[torch.Tensor, ...], i: int) -> torch.Tensor:
    return t[i]
