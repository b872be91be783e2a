"""The base of forge's whole-graph rewrites: a graph being rewritten (with its constants' values), the
Rewrite interface, and the matching helpers the rewrites share (forge.runtime.rewrites has the table of them)."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.fx


class Graph:
    """A graph module being rewritten, with the values of its constant inputs."""

    def __init__(self, gm: torch.fx.GraphModule, template: list[Any], user_slots: list[int]) -> None:
        self.gm, self.graph = gm, gm.graph
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        users = set(user_slots)
        self._consts = {p: template[i] for i, p in enumerate(placeholders)
                        if i not in users and isinstance(template[i], torch.Tensor)}
        self._count = 0

    def const(self, node: Any) -> torch.Tensor | None:
        """The value of `node` if it is a constant tensor (a parameter, a buffer, a folded constant)."""
        if not isinstance(node, torch.fx.Node):
            return None
        if node.op == "get_attr":
            return getattr(self.gm, str(node.target), None)
        return self._consts.get(node)

    def add_const(self, value: torch.Tensor, before: torch.fx.Node, stem: str) -> torch.fx.Node:
        """A new constant as a `get_attr` node inserted before `before`."""
        self._count += 1
        name = f"_forge_{stem}_{self._count}"
        self.gm.register_buffer(name, value.detach().clone(), persistent=False)
        with self.graph.inserting_before(before):
            node = self.graph.get_attr(name)
        node.meta["val"] = value
        return node

    def call(self, target: Any, args: tuple[Any, ...], before: torch.fx.Node, like: torch.fx.Node | None = None,
             kwargs: dict[str, Any] | None = None) -> torch.fx.Node:
        """A new call_function node before `before`, carrying `like`'s metadata (its value's shape and dtype)."""
        with self.graph.inserting_before(before):
            node = self.graph.call_function(target, args, kwargs or {})
        if like is not None:
            node.meta = dict(like.meta)
        return node

    def finish(self) -> None:
        """Drop what no longer has users (nodes, and constants a later rewrite replaced) and recompile."""
        self.graph.eliminate_dead_code()
        used = {str(n.target) for n in self.graph.nodes if n.op == "get_attr"}
        for name in [b for b, _ in self.gm.named_buffers() if b.startswith("_forge_") and b not in used]:
            delattr(self.gm, name)
        self.graph.lint()
        self.gm.recompile()


def is_op(node: Any, *targets: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def sdpa_call(node: Any) -> dict[str, Any] | None:
    """The arguments by name of a `scaled_dot_product_attention` node; None for any other node."""
    if not is_op(node, torch.ops.aten.scaled_dot_product_attention.default):
        return None
    return dict(zip(SDPA_ARGS, node.args, strict=False)) | dict(node.kwargs)


def only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


class Rewrite(ABC):
    """One kind of rewrite; `apply` changes the graph in place and returns how many sites it rewrote."""

    name: str = ""
    devices: tuple[str, ...] = ("cpu", "cuda")
    # The rewrite leaves passes that only a fusing compiler makes one (a softmax around GEMMs): without
    # Inductor it may not pay, so forge.runtime.variants also judges it compiled.
    pays_compiled: bool = False
    # Rewrites that make this one's sites (fold-bn turns convolution + BatchNorm + ReLU into convolution +
    # ReLU): when the greedy chain did not keep them, this one is also tried on top of them.
    after: tuple[str, ...] = ()

    def applies_to(self, device: str) -> bool:
        """Whether the rewrite is for this device type."""
        return device.split(":")[0] in self.devices

    @abstractmethod
    def apply(self, g: Graph) -> int:
        """Rewrite every site in `g`; the number of sites."""


def outputs_row_major(g: Graph) -> None:
    """Graph outputs that eager returns row-major stay row-major (a rewrite may have made them NHWC, or slices
    of a merged matmul): user code may `view` them."""
    out = next(n for n in g.graph.nodes if n.op == "output")

    def fix(a: Any) -> Any:
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.is_contiguous():
            return g.call(row_major, (a,), out, like=a)
        return a

    out.args = (torch.fx.node.map_aggregate(out.args[0], fix),)


def row_major(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a row-major copy of it when it is not row-major."""
    return t if t.is_contiguous() else t.contiguous()


def same_meta(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.shape == vb.shape and \
        va.dtype == vb.dtype


def stable_toposort(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of `graph` in an order where every node follows its inputs (original order otherwise)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    pending = {n: len(set(n.all_input_nodes)) for n in graph.nodes}
    new, env = torch.fx.Graph(), {}
    heap = [(order[n], n.name, n) for n, k in pending.items() if k == 0]
    heapq.heapify(heap)
    while heap:
        _, _, n = heapq.heappop(heap)
        env[n] = new.node_copy(n, env.__getitem__)
        for u in n.users:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(heap, (order[u], u.name, u))
    if len(env) != len(order):
        raise RuntimeError("the patched graph has a cycle")
    return new
