"""Block-wise capture: a model of repeated blocks captured one distinct block at a time, plus the glue.

A model's repeated blocks are the members of its first `nn.ModuleList` (in module order) of at least two
members (decoder layers, transformer blocks). The glue is the model captured with every block passed
through: its outputs (their structure found by running the block on export's fake tensors outside the
trace, once per distinct call) are opaque copies of its inputs of the same shape, dtype and strides (a
residual stream's output is like its input), so the glue's regions end where a block was; that capture
also records each block's call (positional and keyword arguments, as export traced them). Blocks whose class,
parameters, buffers and call (shapes, dtypes, strides, constants) agree are one distinct block: it is
captured once (forge.capture.export.capture) on empty tensors of the recorded shapes, and its tasks count
once per repetition. Tasks of the same key across the glue and the blocks are one task.

Export time grows with the number of distinct blocks, not with depth. The tasks are those of the whole
graph cut at the block boundaries (`block_scope`). A model without such blocks, or with a block whose
output has a tensor none of its inputs is like, is not cut this way (`blockwise` returns None).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils import _pytree as pytree

from forge.capture.export import Capture, TensorMeta, capture
from forge.capture.timing import filled, time_graph
from forge.errors import UserError
from forge.tasks.cut import Task, build_tasks
from forge.tasks.ops import op_name

log = logging.getLogger(__name__)

PASSED = "forge_capture.passed_block.default"  # a block passed through in the glue, as Task.ops names it


@dataclass(frozen=True)
class Call:
    """One recorded block call: where the block is, its signature, and its arguments (tensors as Specs)."""

    path: str
    signature: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Blockwise:
    """A model's tasks from its distinct blocks and its glue."""

    tasks: tuple[Task, ...]
    blocks: dict[str, int]  # the first path of each distinct block -> its calls in a forward
    nodes: int  # ATen nodes captured (glue and one of each distinct block)
    seconds: float


def block_list(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The members of the model's ModuleList of two or more distinct modules that holds the most parameter
    elements (the decoder layers, not a block's [Linear, Dropout]), with their paths."""
    lists = [(name, mod) for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.ModuleList) and len({id(m) for m in mod}) == len(mod) >= 2]
    if not lists:
        return []
    name, best = max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))
    return [(f"{name}.{i}" if name else str(i), m) for i, m in enumerate(best)]


@dataclass(frozen=True)
class Spec:
    """A tensor argument of a recorded call: what is needed to make one like it outside the trace."""

    meta: TensorMeta
    device: str

    def make(self) -> torch.Tensor:
        """An empty tensor of this shape, stride and dtype on this device."""
        return torch.empty_strided(self.meta.shape, self.meta.stride, dtype=self.meta.torch_dtype,
                                   device=self.device)


def _spec(x: Any) -> Any:
    """A traced tensor as its Spec; anything else as is."""
    return Spec(TensorMeta.of(x), str(x.device)) if isinstance(x, torch.Tensor) else x


def spec_of(tree: Any) -> Any:
    """`tree` with every tensor in it as its Spec."""
    return pytree.tree_map(_spec, tree)


def _describe(x: Any) -> str:
    """A call argument as text: tensors by meta, containers by their members, the rest by repr."""
    if isinstance(x, Spec):
        return f"T{x.meta.shape}{x.meta.dtype}{x.meta.stride}{x.device}"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__}({', '.join(_describe(v) for v in x)})"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in sorted(x.items())) + "}"
    return repr(x)


# Attributes that number a block among its kind (transformers' layer_idx): two blocks that differ only
# there are one block. A forward that branches on one of them is a limit of block-wise capture.
_INDEX_ATTRS = {"layer_idx", "layer_id", "layer_number", "block_idx", "idx"}
CONSTANTS = (type(None), bool, int, float, str, torch.dtype, torch.device)


def _plain(v: Any) -> str | None:
    """An attribute as text where it can change a block's work: constants and containers of them by value,
    a tensor attribute (not a parameter or buffer) by meta; None for the rest."""
    if isinstance(v, CONSTANTS):
        return repr(v)
    if isinstance(v, (tuple, list)) and all(isinstance(x, CONSTANTS) for x in v):
        return repr(v)
    if isinstance(v, torch.Tensor):
        return f"tensor {TensorMeta.of(v).short()}"  # a per-block value: dispatch gives each block its own
    return None


def _attributes(block: torch.nn.Module) -> list[tuple[str, str, str, str]]:
    """Each submodule's path, class, extra_repr (a GELU's approximation, a norm's eps) and plain
    attributes (a layer's type, a sliding window, a flag, a tuple of sizes, a tensor's meta), index
    attributes left out."""
    out = []
    for path, m in block.named_modules():
        plain = sorted((k, t) for k, v in vars(m).items()
                       if not k.startswith("_") and k not in _INDEX_ATTRS and (t := _plain(v)) is not None)
        out.append((path, type(m).__qualname__, m.extra_repr(), repr(plain)))
    return out


def signature(block: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """What makes two blocks one: class, submodules (classes, settings, plain attributes), parameters and
    buffers (names, shapes, dtypes) and the call (forge.capture.blocks module docstring)."""
    state = [(n, tuple(t.shape), str(t.dtype)) for n, t in (*block.named_parameters(), *block.named_buffers())]
    return f"{type(block).__qualname__}|{_attributes(block)}|{state}|{_describe(args)}|{_describe(kwargs)}"


class NotBlockwise(Exception):
    """Why a model cannot be captured block-wise (it is captured whole)."""


@dataclass
class _Seen:
    """What the blocks were called with during the glue's capture (not module state: export restores that)."""

    calls: list[Call] = field(default_factory=list)
    given: list[torch.Tensor] = field(default_factory=list)


class _Glue(torch.nn.Module):
    """The model with its blocks passed through, returning also every tensor a block was given: what only
    blocks read (a causal mask, rotary tables) is glue work and must stay in the glue's graph."""

    def __init__(self, model: torch.nn.Module, blocks: list[tuple[str, torch.nn.Module]]) -> None:
        super().__init__()
        self.model = model
        self.paths = {id(m): p for p, m in blocks}
        self.seen = _Seen()

    def on_call(self, mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Forward pre-hook of a block: record its call (tensors as Specs) and keep what it was given."""
        a, kw = spec_of((tuple(args), dict(kwargs)))
        odd = [type(v).__name__ for v in pytree.tree_leaves((a, kw)) if not isinstance(v, (Spec, *CONSTANTS))]
        if odd:  # a cache or other state shared between blocks: what one block does is not all of it
            raise NotBlockwise(f"a block is called with a {odd[0]}")
        path = self.paths[id(mod)]
        self.seen.calls.append(Call(path, signature(mod, a, kw), a, kw))
        self.seen.given += [x for x in pytree.tree_leaves((tuple(args), dict(kwargs))) if isinstance(x, torch.Tensor)]

    def forward(self, *inputs: Any) -> Any:
        self.seen.calls.clear()
        self.seen.given.clear()
        out = self.model(*inputs)
        return out, *self.seen.given


class Bound(torch.nn.Module):
    """A block called with its recorded constants: the tensors of its call come in positionally."""

    def __init__(self, block: torch.nn.Module, call: Call) -> None:
        super().__init__()
        self.block = block
        leaves, self._spec = pytree.tree_flatten((call.args, call.kwargs))
        self._tensor_at = [i for i, v in enumerate(leaves) if isinstance(v, Spec)]
        self._leaves = [v.make() if isinstance(v, Spec) else v for v in leaves]

    def tensors(self) -> list[torch.Tensor]:
        """The call's tensors, in the order forward takes them."""
        return [self._leaves[i] for i in self._tensor_at]

    def forward(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self._leaves)
        for i, t in zip(self._tensor_at, tensors, strict=True):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        return self.block(*args, **kwargs)


@torch.library.custom_op("forge_capture::passed_block", mutates_args=())
def passed_block(x: torch.Tensor) -> torch.Tensor:
    """A block passed through in the glue: opaque, so that the glue's regions end where a block was (the
    regions on either side of a block are not one region); its own task is dropped."""
    return x.clone()


@passed_block.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _output_of(forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], key: str,
               seen: dict[str, Any]) -> tuple[list[Any], Any]:
    """The block's output leaves (tensors as Specs) and structure on this call: the block run on export's
    fake tensors with the tracing set aside (nothing enters the glue's graph), once per signature."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    if key not in seen:
        with disable_proxy_modes_tracing():
            leaves, tree = pytree.tree_flatten(forward(*args, **kwargs))
        seen[key] = ([_spec(x) for x in leaves], tree)
    return seen[key]


def _through(leaves: list[Any], tree: Any, args: tuple, kwargs: dict) -> Any:
    """A block's output made of its inputs: each output tensor is an opaque copy of the first unused input
    tensor of its shape, dtype and strides (a residual stream's output is its input's like)."""
    given = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    used: set[int] = set()
    out = []
    for leaf in leaves:
        if not isinstance(leaf, Spec):
            out.append(leaf)
            continue
        like = [i for i, x in enumerate(given) if i not in used and TensorMeta.of(x) == leaf.meta]
        if len(like) != 1:  # none, or two streams of one shape that could be wired either way
            raise NotBlockwise(f"a block's output {leaf.meta} is like {len(like)} of its inputs, not one")
        (i,) = like
        used.add(i)
        out.append(passed_block(given[i]))
    return pytree.tree_unflatten(out, tree)


@contextmanager
def _passed_through(blocks: list[tuple[str, torch.nn.Module]], calls: _Seen) -> Iterator[None]:
    """Every block's forward returns its output made of its inputs (_through), for capturing the glue; the
    call's signature is the one the pre-hook just recorded in `calls`."""
    outputs: dict[str, Any] = {}

    def passed(forward: Callable[..., Any]) -> Callable[..., Any]:
        def through(*args: Any, **kwargs: Any) -> Any:
            key = calls.calls[-1].signature
            return _through(*_output_of(forward, args, kwargs, key, outputs), args, kwargs)
        return through

    with forwards_set([(m, passed(m.forward)) for _, m in blocks]):
        yield


@contextmanager
def forwards_set(pairs: list[tuple[torch.nn.Module, Callable[..., Any]]]) -> Iterator[None]:
    """Each module's forward replaced by its callable for the duration, as an instance attribute
    (nn.Module.__call__ finds it first; hooks still run); a forward set on the instance before is put back."""
    before = [(m, vars(m).get("forward")) for m, _ in pairs]
    for m, f in pairs:
        m.forward = f
    try:
        yield
    finally:
        for m, was in before:
            if was is None:
                del m.forward
            else:
                m.forward = was


def _merge(parts: list[tuple[list[Task], int, str]]) -> tuple[Task, ...]:
    """Tasks of several graphs, each repeated n times, merged by key (counts and times summed); occurrences
    are named `prefix:node` after the graph they were found in."""
    by_key: dict[str, Task] = {}
    for tasks, n, prefix in parts:
        for t in tasks:
            if t.ops == (PASSED,):  # a block passed through: not work of the glue
                continue
            occ = tuple(tuple(f"{prefix}:{x}" for x in o) for o in t.occurrences)
            ms = t.ms * n if t.ms is not None else None
            if t.key in by_key:
                old = by_key[t.key]
                ms = old.ms + ms if old.ms is not None and ms is not None else None
                by_key[t.key] = replace(old, count=old.count + t.count * n, ms=ms,
                                        occurrences=old.occurrences + occ)
            else:
                by_key[t.key] = replace(t, count=t.count * n, ms=ms, share=None, occurrences=occ)
    return tuple(sorted(by_key.values(), key=lambda t: -t.count * t.bytes))


def _nodes(cap: Capture) -> int:
    """The capture's ATen call nodes."""
    return sum(1 for n in cap.graph_module.graph.nodes if n.op == "call_function")


def block_scope(paths: list[str]) -> Callable[[torch.fx.Node], str]:
    """A node's block in a whole-graph capture (its module stack's block path, "" for glue): a whole graph cut
    with it gives the regions a block-wise capture gives."""
    known = set(paths)

    def scope(node: torch.fx.Node) -> str:
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            if path in known:
                return path
        return ""
    return scope


def _glue(model: torch.nn.Module, inputs: list[Any], blocks: list[tuple[str, torch.nn.Module]]
          ) -> tuple[Capture, list[Call]]:
    """The glue's capture (every block passed through) and every block call it saw; NotBlockwise if a
    block was not called or cannot be passed through."""
    glue_model = _Glue(model, blocks)
    handles = [m.register_forward_pre_hook(glue_model.on_call, with_kwargs=True) for _, m in blocks]
    try:
        with _passed_through(blocks, glue_model.seen):
            glue = capture(glue_model, inputs)
    except UserError as e:
        raise NotBlockwise(str(e.__cause__ or e)) from e
    finally:
        for h in handles:
            h.remove()
    calls = list(glue_model.seen.calls)
    if {c.path for c in calls} != {p for p, _ in blocks}:
        raise NotBlockwise("a block the forward does not call")
    return glue, calls


def _glue_scope(node: torch.fx.Node) -> str:
    """A passed block is a region of its own in the glue (no view of the glue joins it)."""
    return "passed" if op_name(node.target) == "passed_block" else ""


def _timed(cap: Capture, user_inputs: list[Any], device: str, budget_s: float | None,
           scope: Callable[[torch.fx.Node], str] | None = None) -> list[Task]:
    """The capture's tasks, timed on `user_inputs` when a budget is given (forge.capture.timing)."""
    if budget_s is None:
        return build_tasks(cap.graph_module.graph, scope=scope)
    times = time_graph(cap.graph_module, cap.flat_args(user_inputs), device, budget_s=budget_s)
    return build_tasks(cap.graph_module.graph, times.node_ms, scope=scope)


def blockwise(model: torch.nn.Module, inputs: list[Any], budget_s: float | None = None) -> Blockwise | None:
    """The model's tasks captured block-wise (module docstring); None where it does not apply (logged): no
    repeated blocks, a block called with shared state (a cache), an output tensor that is like none or
    several of its block's inputs, a block not called, a capture that failed. `budget_s` (real inputs
    only): time the glue and each kind of block for about that long each, and give the tasks their times
    and shares; None: untimed. A kind is timed on tensors like its traced call's (timing.filled): in an eager
    forward the blocks may be called otherwise (transformers passes Qwen 3.5's attention no mask in eager
    and a causal one under export)."""
    start = time.perf_counter()
    blocks = block_list(model)
    if not blocks:
        return None
    device = next((str(x.device) for x in inputs if isinstance(x, torch.Tensor)), "cpu")
    try:
        glue, calls = _glue(model, inputs, blocks)
        distinct: dict[str, list[Call]] = {}
        for c in calls:
            distinct.setdefault(c.signature, []).append(c)
        parts = [(_timed(glue, inputs, device, budget_s, _glue_scope), 1, "glue")]
        nodes, by_path = _nodes(glue), dict(blocks)
        for group in distinct.values():
            bound = Bound(by_path[group[0].path], group[0])
            cap = capture(bound, bound.tensors())
            nodes += _nodes(cap)
            made = [filled(t) for t in bound.tensors()] if budget_s is not None else []
            parts.append((_timed(cap, made, device, budget_s), len(group), group[0].path))
    except (NotBlockwise, UserError) as e:
        log.info("block-wise capture does not apply (%s): the whole graph is captured", e)
        return None
    seconds = time.perf_counter() - start
    log.info("block-wise capture: %d block calls, %d distinct, %d ATen nodes in %.1f s", len(calls),
             len(distinct), nodes, seconds)
    return Blockwise(_shared(_merge(parts)), {g[0].path: len(g) for g in distinct.values()}, nodes, seconds)


def _shared(tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    """Shares of model time from the merged tasks' summed times (None where untimed)."""
    total = sum(t.ms or 0.0 for t in tasks)
    return tuple(replace(t, share=t.ms / total if t.ms is not None and total else None) for t in tasks)
