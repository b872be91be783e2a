"""Cutting a captured ATen graph into regions: heavy single ops and fusible pointwise/reduction regions.

A region is a convex set of call_function nodes (no path leaves it and comes back), so it can be
replaced by one kernel call. Rules (forge.tasks.ops gives each op its Kind):
- HEAVY and SINGLE ops are regions of their own; views feeding only one heavy op join it (a
  transposed weight is part of its matmul);
- connected POINTWISE, VIEW and FACTORY nodes around at most one REDUCE node form one region;
- `getitem` of a multi-output op stays with its producer;
- with a `scope` (a node's block, forge.capture.blocks), nodes of different scopes are never one region.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.fx

from forge.tasks.ops import Kind, kind_of

# Ops that compute nothing (export's runtime asserts): left out of every region.
_NOOPS = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "_assert_async",
          "sym_constrain_range"}


@dataclass
class _Group:
    members: list[torch.fx.Node]
    bits: int
    fusible: bool
    reduces: int
    ext: set[torch.fx.Node] = field(default_factory=set)  # call_function inputs from outside
    scope: str = ""


def is_noop(node: torch.fx.Node) -> bool:
    """True for assert-like nodes that compute nothing."""
    name = getattr(node.target, "__name__", "")
    return node.op == "call_function" and (
        name.split(".")[0] in _NOOPS or (node.meta.get("val") is None and not node.users))


def cut(graph: torch.fx.Graph, scope: Callable[[torch.fx.Node], str] | None = None) -> list[list[torch.fx.Node]]:
    """Regions of `graph`, each a list of nodes in graph order, regions in order of their first node;
    `scope`: what a node belongs to (regions do not cross scopes; default: one scope)."""
    nodes = [n for n in graph.nodes if n.op == "call_function" and not is_noop(n)]
    bit = {n: i for i, n in enumerate(nodes)}
    anc: dict[torch.fx.Node, int] = {}  # bitset of call_function ancestors
    for n in nodes:
        a = 0
        for p in n.all_input_nodes:
            if p in bit:
                a |= anc[p] | (1 << bit[p])
        anc[n] = a
    group = _grown(nodes, bit, anc, scope or (lambda n: ""))
    groups: list[_Group] = []
    seen: set[int] = set()
    for n in nodes:
        g = group[n]
        if id(g) not in seen:
            seen.add(id(g))
            groups.append(g)
    _views_into_heavy_ops(groups, group)
    order = {n: i for i, n in enumerate(graph.nodes)}
    out = [sorted(g.members, key=order.__getitem__) for g in groups if g.members]
    out.sort(key=lambda ms: order[ms[0]])
    return out


def _grown(nodes: list[torch.fx.Node], bit: dict[torch.fx.Node, int], anc: dict[torch.fx.Node, int],
           scope: Callable[[torch.fx.Node], str]) -> dict[torch.fx.Node, _Group]:
    """Each node's group: in graph order, a fusible node joins the groups of its inputs, largest first, where
    the union stays convex and holds one reduction at most."""
    group: dict[torch.fx.Node, _Group] = {}
    for n in nodes:
        k = kind_of(n.target)
        ins = [p for p in n.all_input_nodes if p in bit]
        if n.target is operator.getitem and ins and ins[0] in group:
            g = group[ins[0]]
            g.members.append(n)
            g.bits |= 1 << bit[n]
            group[n] = g
            continue
        fusible = k in (Kind.POINTWISE, Kind.VIEW, Kind.FACTORY, Kind.REDUCE)
        g = _Group([n], 1 << bit[n], fusible, int(k is Kind.REDUCE), set(ins), scope(n))
        if fusible:
            cands: list[_Group] = []
            for p in ins:
                c = group[p]
                if c.fusible and c.scope == g.scope and all(c is not x for x in cands):
                    cands.append(c)
            for c in sorted(cands, key=lambda c: -len(c.members)):
                m = _merged(c, g, bit, anc)
                if m is not None:
                    g = m
        for m in g.members:
            group[m] = g
    return group


def _merged(a: _Group, b: _Group, bit: dict[torch.fx.Node, int], anc: dict[torch.fx.Node, int]) -> _Group | None:
    """a and b as one group, or None if that breaks convexity or the one-reduction rule."""
    if a.reduces + b.reduces > 1:
        return None
    bits = a.bits | b.bits
    ext = {p for p in a.ext | b.ext if not (bits >> bit[p]) & 1}
    outside = 0  # the ancestors of what the union reads from outside it: none may lie inside it
    for p in ext:
        outside |= anc[p]
    if outside & bits:
        return None
    return _Group(a.members + b.members, bits, True, a.reduces + b.reduces, ext, a.scope)


def _views_into_heavy_ops(groups: list[_Group], group: dict[torch.fx.Node, _Group]) -> None:
    """Views that feed one heavy op only become part of it (a weight transpose belongs to its matmul)."""
    for g in groups:
        if not g.members or any(kind_of(m.target) not in (Kind.VIEW, Kind.FACTORY) for m in g.members):
            continue
        users = {u for m in g.members for u in m.users if u not in g.members and not is_noop(u)}
        owners = {id(group[u]): group[u] for u in users if u in group}
        if len(owners) != 1 or len(users) != sum(1 for u in users if u in group):
            continue
        (h,) = owners.values()
        if h.fusible or h.scope != g.scope:
            continue
        h.members = g.members + h.members
        h.bits |= g.bits
        for m in g.members:
            group[m] = h
        g.members = []
