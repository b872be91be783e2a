"""Block-wise dispatch: found kernels applied inside each repeated block of a model, the model otherwise its own.

The blocks are forge.capture.blocks' (the members of the model's largest ModuleList). One eager forward
records every block's call; blocks whose signatures agree (forge.capture.blocks.signature: class, settings,
parameter shapes, the call's shapes and constants) are one kind. Each kind is captured and patched once
(forge.runtime.dispatch.apply, on tensors like its first call's), and every block of the kind runs that
patched graph with its own parameters and buffers, so capture and patching grow with the number of kinds,
not with depth. A block's forward is replaced only while `BlockwiseModule` runs the model: the user's module
tree, state dict and hooks stay as they are (a block's hooks fire, since its `__call__` is the same), and
the glue between blocks runs as the model's own code. A block called in two ways (twice in a forward, or
otherwise while a CUDA graph is captured) has a patched graph for each recorded call; a call unlike every
recorded one (other shapes, other constants) runs the block's own forward and is counted
(`BlockwiseModule.block_fallbacks`). With `cuda_graph` the whole forward, glue included, is captured once as
one CUDA graph and replayed; its calls are recorded from a forward under capture too, since a model may call
its blocks otherwise then (transformers materialises Qwen 3.5's causal mask while a stream captures, where
eager passes none).

The glue's kernels (a final norm, the output head) are not applied this way: the glue runs eager.

Compiled block by block (`apply_blockwise(..., compile=True)`): each kind's patched graph (found kernels as the
opaque op `forge::kernel`, or none) goes through torch.compile once, and every block of the kind calls that
compilation with its own parameters, where torch.compile of the whole model compiles every block again
(Qwen 3.5's default-mode compile did not finish in 495 s on an H200).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from forge.capture.blocks import CONSTANTS, Bound, Call, Spec, block_list, forwards_set, signature, spec_of
from forge.capture.export import Capture, capture
from forge.errors import UserError
from forge.kernel import KernelArtifact
from forge.runtime.dispatch import Counters, GuardedForward, OptimizedModule, apply
from forge.runtime.graphs import same_stream

log = logging.getLogger(__name__)


class _Patched:
    """One recorded call of a block and its kind's patched graph (or that graph compiled: `run`), run on this
    block's own state."""

    def __init__(self, opt: OptimizedModule, template: list[Any], call: Call, out_spec: pytree.TreeSpec,
                 n_out: int, run: Callable[..., Any] | None = None) -> None:
        self.gm, self.template, self.slots = opt.gm if run is None else run, template, opt._user_slots
        leaves, self.spec = pytree.tree_flatten((call.args, call.kwargs))
        self.typed = _typed(leaves)
        self.tensor_at = [i for i, v in enumerate(leaves) if isinstance(v, Spec)]
        self.out_spec, self.n_out = out_spec, n_out
        self.layouts = None  # a call of tensors alone, positional: their layouts (see _layouts)
        if not call.kwargs and all(isinstance(a, Spec) for a in call.args):
            self.layouts = tuple((torch.Size(a.meta.shape), a.meta.stride, a.meta.torch_dtype, torch.device(a.device))
                                 for a in call.args)

    def __call__(self, leaves: list[Any]) -> Any:
        flat = list(self.template)
        for slot, i in zip(self.slots, self.tensor_at, strict=True):
            flat[slot] = leaves[i]
        out = self.gm(*flat)
        return pytree.tree_unflatten(list(out)[len(out) - self.n_out:], self.out_spec)


class _BlockForward:
    """One block's forward: the patched graph of the recorded call this call is like, else its own forward.
    A call of tensors alone, positional, is looked up by their layouts in a table of the recorded calls of
    that form (`by_layouts`: exact, since such a call matches a recorded one just where every tensor's shape,
    stride, dtype and device do); flattening it and comparing Specs, the long way, cost ~12 us a call on a
    2-core CPU against ~1 (benchmarks/blockwise_overhead.py)."""

    def __init__(self, own: Callable[..., Any]) -> None:
        self.own, self.fallbacks = own, 0
        self.calls: list[_Patched] = []
        self.by_layouts: dict[tuple[Any, ...], _Patched] = {}

    def add(self, patched: _Patched) -> None:
        """A recorded call's patched graph."""
        self.calls.append(patched)
        if patched.layouts is not None:
            self.by_layouts.setdefault(patched.layouts, patched)  # the first, as the long way finds it

    def knows(self, call: Call) -> bool:
        """Whether a call like `call` (its structure, types and constants) already has a patched graph."""
        leaves, spec = pytree.tree_flatten((call.args, call.kwargs))
        typed = _typed(leaves)
        return any(p.spec == spec and p.typed == typed for p in self.calls)

    def find(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Patched | None, list[Any]]:
        """(the recorded call like this one or None, the call's leaves)."""
        key = None if kwargs else _layouts(args)
        if key is not None:
            try:
                return self.by_layouts.get(key), list(args)
            except TypeError:  # symbolic sizes (a trace with dynamic shapes) do not hash: the long way
                pass
        leaves, spec = pytree.tree_flatten((args, kwargs))
        return self.match(leaves, spec), leaves

    def match(self, leaves: list[Any], spec: pytree.TreeSpec) -> _Patched | None:
        """The long way: the recorded call with this structure, these types and constants, or None."""
        typed = None
        for p in self.calls:
            if p.spec == spec:
                typed = typed or _typed(spec_of(leaves))
                if p.typed == typed:
                    return p
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        p, leaves = self.find(args, kwargs)
        if p is None:
            self.fallbacks += 1  # not a call the graphs were captured for
            return self.own(*args, **kwargs)
        return p(leaves)


def _layouts(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Positional tensors as (shape, stride, dtype, device) each: a call's key in `_BlockForward.by_layouts`;
    None where an argument is not a tensor."""
    if not all(isinstance(a, torch.Tensor) for a in args):
        return None
    return tuple((a.shape, a.stride(), a.dtype, a.device) for a in args)


def _typed(leaves: list[Any]) -> list[tuple[type, Any]]:
    """Leaves with their types: a call with `1` is not the call recorded with `True` or `1.0`."""
    return [(type(x), x) for x in leaves]


def _record(model: torch.nn.Module, inputs: list[Any], blocks: list[tuple[str, torch.nn.Module]],
            capturing: bool = False) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]] | None:
    """Every block call of one eager forward (path, args, kwargs); None when a call takes something other
    than tensors and constants (a cache shared between blocks). `capturing`: of a forward captured as a
    (discarded) CUDA graph, since models call their blocks otherwise then (module docstring); [] when the
    forward cannot be captured."""
    paths, calls = {id(m): p for p, m in blocks}, []

    def hook(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append((paths[id(mod)], tuple(args), dict(kwargs)))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for _, m in blocks]
    try:
        with torch.no_grad():
            if not capturing:
                model(*inputs)
            else:
                try:
                    with same_stream(), torch.cuda.graph(torch.cuda.CUDAGraph()):
                        model(*inputs)
                except Exception as e:  # noqa: BLE001 - GuardedForward says why when it captures
                    log.info("block calls under CUDA graph capture not recorded: %s: %s", type(e).__name__, e)
                    return []
    finally:
        for h in handles:
            h.remove()
    leaves = pytree.tree_leaves([(a, kw) for _, a, kw in calls])
    if any(not isinstance(x, (torch.Tensor, *CONSTANTS)) for x in leaves):
        return None
    return calls


class NotDispatchable(Exception):
    """Why a kind of block cannot run as one patched graph for all its blocks."""


def _own(block: torch.nn.Module, target: str) -> torch.Tensor:
    """The tensor a kind's capture names `block.<path>` (a parameter, buffer or tensor attribute), on this block."""
    obj: Any = block
    for part in target.split(".")[1:]:  # "block." is the Bound's
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.Tensor):
        raise NotDispatchable(f"{target} is not a tensor of every block of its kind")
    return obj


def _template(cap: Capture, block: torch.nn.Module, slots: list[int], first: list[Any]) -> list[Any]:
    """The patched graph's arguments for `block`: its own parameters, buffers and tensor attributes where the
    first block's were (a kind's capture names them `block.<path>`), the user slots left for the call's
    tensors; NotDispatchable for a graph input that is not one of those."""
    flat = list(first)
    for i, spec in enumerate(cap.exported.graph_signature.input_specs):
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            flat[i] = _own(block, spec.target)
        elif spec.kind != InputKind.USER_INPUT:
            raise NotDispatchable(f"a graph input of kind {spec.kind.name}")
    for s in slots:
        flat[s] = None
    return flat


def _no_mutation(cap: Capture) -> None:
    """NotDispatchable when the block changes state (a buffer, an input in place): the patched graph returns
    such updates as outputs, and block-wise dispatch does not write them back."""
    kinds = {o.kind for o in cap.exported.graph_signature.output_specs} - {OutputKind.USER_OUTPUT}
    if kinds:
        raise NotDispatchable(f"the block changes state ({', '.join(sorted(k.name for k in kinds))})")


def _kind(block: torch.nn.Module, call: Call, kernels: list[KernelArtifact], strict: bool
          ) -> tuple[OptimizedModule, Capture]:
    """A kind of block captured on tensors like its first call's and patched with the kernels."""
    bound = Bound(block, call)
    cap = capture(bound, bound.tensors())
    _no_mutation(cap)
    return apply(bound, bound.tensors(), kernels, strict=strict, cap=cap), cap


class BlockwiseModule(GuardedForward):
    """The user's model with its blocks running their kinds' patched graphs (module docstring); input checks
    and CUDA graph replay as GuardedForward's."""

    def __init__(self, model: torch.nn.Module, forwards: dict[int, tuple[torch.nn.Module, _BlockForward]],
                 kinds: list[OptimizedModule], inputs: list[Any], cuda_graph: bool) -> None:
        super().__init__(model, inputs, cuda_graph)
        self._forwards, self._kinds = forwards, kinds

    @property
    def blocks(self) -> int:
        """The blocks dispatched."""
        return len(self._forwards)

    @property
    def kinds(self) -> int:
        """Their kinds (one patched graph, compiled once, each)."""
        return len(self._kinds)

    @property
    def block_fallbacks(self) -> int:
        """Block calls that ran the block's own forward (a call unlike the recorded one)."""
        return sum(f.fallbacks for _, f in self._forwards.values())

    def check_patched(self, kernels: bool) -> None:
        """RuntimeError unless every block ran its kind's graph (and a kernel ran, with `kernels`): a block-wise
        variant is then what it says."""
        if self.block_fallbacks or self.model_fallbacks:
            raise RuntimeError(f"{self.block_fallbacks} block calls and {self.model_fallbacks} forwards ran eager")
        if kernels and not any(c.hits for c in self.counters().values()):
            raise RuntimeError("no kernel applies to any block")

    def _run(self, *inputs: Any) -> Any:
        with forwards_set(list(self._forwards.values())), torch.no_grad():  # hooks still run
            return self.original(*inputs)

    def counters(self) -> dict[str, Counters]:
        """Per task key: hits and fallbacks (by reason), over every block of every kind."""
        return {k: c for opt in self._kinds for k, c in opt.counters().items()}


def apply_blockwise(model: torch.nn.Module, inputs: list[Any], kernels: list[KernelArtifact],
                    strict: bool = False, cuda_graph: bool = False, compile: bool = False) -> BlockwiseModule | None:
    """`model` with `kernels` applied block by block (module docstring); None where it has no repeated blocks,
    a block's call cannot be recorded as tensors and constants, or a kind cannot run as one graph (it changes
    state; an input that is not a tensor of each block). Kernels that apply to no block are logged.
    `compile`: each kind's patched graph compiled by torch.compile (Inductor, its default mode), once for all
    the blocks of the kind: they call it with their own parameters as arguments, so compilation, like capture,
    grows with the number of kinds and not with depth (the glue stays eager; `cuda_graph` then replays the
    whole forward, compiled blocks and glue, as one CUDA graph)."""
    blocks = block_list(model)
    calls = _record(model, inputs, blocks) if blocks else None
    if not calls:
        return None
    captured = []  # calls seen only under capture: one that cannot be patched falls back (counted), no more
    if cuda_graph and any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs):
        captured = _record(model, inputs, blocks, capturing=True) or []
    try:
        out = _dispatched(model, inputs, blocks, calls + captured, kernels, strict, cuda_graph, len(calls), compile)
    except NotDispatchable as e:
        log.info("block-wise dispatch does not apply: %s", e)
        return None
    unused = sorted({k.key for k in kernels} - set(out.counters()))
    if unused:  # the eager forward called a block otherwise than the profile's trace did, or glue kernels
        log.warning("forge: %d kernels apply to no block: %s", len(unused), ", ".join(unused[:5]))
    return out


def _dispatched(model: torch.nn.Module, inputs: list[Any], blocks: list[tuple[str, torch.nn.Module]],
                calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]], kernels: list[KernelArtifact],
                strict: bool, cuda_graph: bool, required: int | None = None, compile: bool = False
                ) -> BlockwiseModule:
    """apply_blockwise's module, every kind captured and patched once (and compiled once, `compile`). Calls
    after the first `required` (default: all required) are patched where they can be and otherwise left to
    fall back."""
    by_path = dict(blocks)
    kinds: dict[str, tuple[OptimizedModule, Capture]] = {}
    runs: dict[str, Callable[..., Any]] = {}  # per kind: its graph compiled
    forwards: dict[int, tuple[torch.nn.Module, _BlockForward]] = {}
    for i, (path, args, kwargs) in enumerate(calls):
        block = by_path[path]
        a, kw = spec_of((args, kwargs))
        call = Call(path, signature(block, a, kw), a, kw)
        if id(block) not in forwards:
            forwards[id(block)] = (block, _BlockForward(vars(block).get("forward") or block.forward))
        fwd = forwards[id(block)][1]
        if fwd.knows(call):  # called alike twice in a forward, or alike with and without capture
            continue
        try:
            if call.signature not in kinds:
                kinds[call.signature] = _kind(block, call, kernels, strict)
                if compile and (required is None or i < required):  # a kind seen only under capture would
                    # compile on its first call, inside the capture: it runs its patched graph uncompiled
                    runs[call.signature] = torch.compile(kinds[call.signature][0].gm, dynamic=False)
            opt, cap = kinds[call.signature]
            template = _template(cap, block, opt._user_slots, opt._template)
        except (NotDispatchable, UserError) as e:
            if required is None or i < required:
                raise
            log.info("a call of %s seen only under CUDA graph capture falls back to eager: %s", path, e)
            continue
        fwd.add(_Patched(opt, template, call, cap.exported.call_spec.out_spec, cap.user_output_count(),
                         runs.get(call.signature)))
    log.info("block-wise dispatch: %d blocks, %d kinds%s", len(forwards), len(kinds), ", compiled" if compile else "")
    return BlockwiseModule(model, forwards, [k[0] for k in kinds.values()], inputs, cuda_graph)
