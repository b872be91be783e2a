"""Which exported kernels are one module of the model: those get a layer that `kernels.kernelize` swaps in.

A region is module-aligned when, in the captured graph (torch.export keeps each node's `nn_module_stack`):
- its compute nodes (all but views) lie in one submodule M (not the root), and every node of M is in the region;
- its inputs are M's own parameters and buffers and exactly one other tensor, and M's forward takes one argument;
- its outputs are M's last node, or views of it (a region may carry a consumer's reshape along).
Its layer then calls the kernel on (the forward's argument, M's tensors) and returns the output in M's shape.
Other regions are exported as functions only.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.fx
from torch.export.graph_signature import InputKind

from forge.capture.export import Capture, node_meta
from forge.tasks.cut import region_source
from forge.tasks.ops import Kind, kind_of
from forge.tasks.regions import cut

_CONFIG_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class LayerSpec:
    """How a layer calls one kernel in place of one module's forward."""

    key: str  # the task key
    layer_name: str  # the module's class name: the name kernelize's mapping uses
    module_class: str  # its qualified name
    module_path: str  # where the first such module is in the exported model (for the card)
    arg_name: str  # the forward's one parameter
    inputs: tuple[str, ...]  # per kernel input: "" for the forward's argument, else M's attribute path
    arg_shape: tuple[int, ...]  # the argument as the kernel takes it (a view of the forward's argument)
    out_index: int  # the kernel output that is M's
    out_shape: tuple[int, ...]  # M's output's shape
    config: tuple[tuple[str, object], ...]  # M's plain attributes (eps, ...): the layer runs only when they match


def _stack(n: torch.fx.Node) -> list[str]:
    return [path for path, _ in (n.meta.get("nn_module_stack") or {}).values()]


def _owner(nodes: list[torch.fx.Node]) -> str | None:
    """The deepest module path every node's stack has, or None."""
    stacks = [_stack(n) for n in nodes]
    if not stacks or any(not s for s in stacks):
        return None
    common = [p for p in stacks[0] if all(p in s for s in stacks[1:])]
    return common[-1] if common and common[-1] else None


def _config(mod: torch.nn.Module) -> tuple[tuple[str, object], ...]:
    keep = []
    for k, v in vars(mod).items():
        if k.startswith("_"):  # `training` is kept: a kernel captured in eval mode is no train-mode forward
            continue
        if isinstance(v, _CONFIG_TYPES) or (isinstance(v, tuple) and all(isinstance(x, _CONFIG_TYPES) for x in v)):
            keep.append((k, v))
    return tuple(sorted(keep))


def _view_of(out: torch.fx.Node, last: torch.fx.Node) -> bool:
    n = out
    while n is not last:
        if kind_of(n.target) is not Kind.VIEW or not n.args or not isinstance(n.args[0], torch.fx.Node):
            return False
        n = n.args[0]
    return True


def _spec(model: torch.nn.Module, cap: Capture, region: list[torch.fx.Node], key: str) -> LayerSpec | None:
    """The layer for this region occurrence, or None when it is not one module."""
    compute = [n for n in region if kind_of(n.target) is not Kind.VIEW]
    path = _owner(compute)
    if path is None:
        return None
    graph = cap.graph_module.graph
    # the module's tensor-valued nodes (not its assertions, which return nothing)
    inside = [n for n in graph.nodes if n.op == "call_function" and path in _stack(n) and node_meta(n) is not None]
    members = set(region)
    if not inside or any(n not in members for n in inside):
        return None
    mod = model.get_submodule(path)
    params = list(inspect.signature(type(mod).forward).parameters.values())[1:]
    if len(params) != 1 or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return None
    rendered = region_source(region)
    by_name = {n.name: n for n in graph.nodes}
    owned = {s.arg.name: s.target for s in cap.exported.graph_signature.input_specs
             if s.kind in (InputKind.PARAMETER, InputKind.BUFFER) and s.target}
    inputs, arg_shape = [], ()
    for name in rendered.input_nodes:
        target = owned.get(name)
        if target is not None and target.startswith(path + "."):
            inputs.append(target[len(path) + 1:])
        else:
            inputs.append("")
            arg_shape = tuple(node_meta(by_name[name]).shape)  # type: ignore[union-attr]
    if inputs.count("") != 1:
        return None
    last = inside[-1]
    outs = [by_name[o] for o in rendered.output_nodes]
    if any(u not in members and node_meta(u) is not None for n in inside if n is not last for u in n.users):
        return None
    if not outs or not all(_view_of(o, last) for o in outs):
        return None
    return LayerSpec(key, type(mod).__name__, f"{type(mod).__module__}.{type(mod).__qualname__}", path,
                     params[0].name, tuple(inputs), arg_shape, 0, tuple(node_meta(last).shape),  # type: ignore
                     _config(mod))


def layers(model: torch.nn.Module, cap: Capture, keys: set[str]) -> dict[str, LayerSpec]:
    """The layer of each kernel in `keys` whose region is one module in every occurrence, by the module's class
    name (a class with two such kernels, or occurrences that disagree, gets none)."""
    found: dict[str, list[LayerSpec | None]] = {}
    for region in cut(cap.graph_module.graph):
        key = region_source(region).key
        if key in keys:
            found.setdefault(key, []).append(_spec(model, cap, region, key))
    by_class: dict[str, list[LayerSpec]] = {}
    for specs in found.values():
        first = specs[0]
        if first is not None and all(s is not None and (s.layer_name, s.inputs, s.config) ==
                                     (first.layer_name, first.inputs, first.config) for s in specs):
            by_class.setdefault(first.layer_name, []).append(first)
    return {name: specs[0] for name, specs in by_class.items() if len(specs) == 1}
