"""Attention masks the graph computes from shapes alone, recognised as what they are (forge.runtime.rewrite_fa4).

transformers builds a causal or sliding-window mask from `arange`s of the token positions; exported, that is a
few dozen ATen nodes that read no input of the graph (Gemma 4: 36-41 nodes a mask, no placeholder). Such a
subgraph is evaluated once, when the graph is rewritten (forge.load rewrites again), and the value is
compared with the band a kernel computes from indices: queries i, keys j, d = keys - queries (the queries are
the last ones, as in a prefill after a cache), key j taken part iff i + d - left <= j <= i + d.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

from forge.runtime.rewrite_base import Graph

log = logging.getLogger(__name__)

MAX_NODES = 256  # a mask's subgraph larger than this is not evaluated
MAX_ELEMENTS = 1 << 28  # nor one with a value larger than this (a 16k x 16k mask)
CAUSAL = -1  # band(): the causal mask, every earlier key taken part


def constant_value(g: Graph, node: object) -> torch.Tensor | None:
    """The value of `node` when it is computed from no input of the graph (no parameter, no buffer: a buffer the
    forward updates would change it; no input of the user's) by deterministic ATen ops, and from constants
    forge added; None otherwise (a random op, a function of forge's, too large, a meta capture)."""
    if not isinstance(node, torch.fx.Node) or not _small(node):
        return None
    need: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in need:
            continue
        need.add(n)
        if n.op == "get_attr" and g.const(n) is not None:
            continue
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) or \
                torch.Tag.nondeterministic_seeded in n.target.tags or len(need) > MAX_NODES or not _small(n):
            return None
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(g.graph.nodes)}
    env: dict[torch.fx.Node, object] = {}
    try:
        for n in sorted(need, key=order.__getitem__):
            if n.op == "get_attr":
                env[n] = g.const(n)
                continue
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
            env[n] = n.target(*args, **kwargs)  # type: ignore[operator]
            val = env[n]
            if isinstance(val, torch.Tensor) and (val.device.type == "meta" or val.numel() > MAX_ELEMENTS):
                return None  # a meta capture has no values to look at
    except Exception as e:  # noqa: BLE001 - a mask that cannot be evaluated is simply not recognised
        log.debug("mask %s not evaluated: %s: %s", node.name, type(e).__name__, e)
        return None
    out = env[node]
    return out if isinstance(out, torch.Tensor) else None


def _small(n: torch.fx.Node) -> bool:
    """Whether the node's recorded value (if any) is within MAX_ELEMENTS: checked before anything is computed."""
    val = n.meta.get("val")
    return not isinstance(val, torch.Tensor) or val.numel() <= MAX_ELEMENTS


def band(mask: torch.Tensor, n_q: int, n_k: int) -> int | None:
    """For a boolean SDPA mask (True takes part) over n_q queries and n_k keys, the same for every batch and
    head: CAUSAL when it is the causal mask aligned to the last query, `left` >= 0 when it is that mask cut to
    the `left` keys before each query's own (a sliding window of left + 1), None for anything else."""
    if mask.dtype != torch.bool or mask.dim() < 2 or tuple(mask.shape[-2:]) != (n_q, n_k) or n_q > n_k or n_q < 1:
        return None
    rows = mask.reshape(-1, n_q, n_k)
    first = rows[0]
    if not bool((rows == first).all()):
        return None
    left = int(first[-1].sum()) - 1  # the last query takes part with its own key and the `left` before it
    if left < 0:
        return None
    d = n_k - n_q
    i = torch.arange(n_q, device=mask.device)[:, None]
    j = torch.arange(n_k, device=mask.device)[None, :]
    if not torch.equal(first, (j <= i + d) & (j >= i + d - left)):
        return None
    return CAUSAL if left >= n_k - 1 else left
