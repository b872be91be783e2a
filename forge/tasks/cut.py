"""Tasks: the regions of a captured graph as units of work for the search.

Each region is rendered as a standalone Python function over ATen ops (its *source*). The source is
both the readable form (for people and LLM prompts) and the reference: `Task.reference()` executes it,
so a worker process rebuilds the exact reference from text alone. The structural key is a hash of the
source, which names no graph node: identical blocks of a transformer give one task with a count.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from forge.capture.export import TensorMeta, node_meta
from forge.capture.scans import IMPORT, is_scan
from forge.tasks.ops import Kind, family_of_region, kind_of, op_name, qualified_name
from forge.tasks.origin import origin, scan_origin
from forge.tasks.regions import cut, is_noop

SOURCE_HEADER = "import operator\n\nimport torch\n\naten = torch.ops.aten\n"


@dataclass(frozen=True)
class Task:
    """A region of the model (all its identical occurrences), with its time and reference source."""

    key: str
    family: str
    ops: tuple[str, ...]
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    source: str
    count: int
    ms: float | None  # summed over all occurrences; None for a meta capture
    share: float | None  # of the model's total time
    occurrences: tuple[tuple[str, ...], ...] = ()  # node names of each occurrence in the captured graph
    module: str = ""  # the model's module it ran in: "path (Class)" (forge.tasks.origin), "" if unknown
    module_source: str = ""  # that module's forward source

    @property
    def bytes(self) -> int:
        """Bytes one occurrence must move at least: each input read once, each output written once."""
        return sum(m.nbytes for m in self.inputs + self.outputs)

    def reference(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        """The region as a callable: inputs in `self.inputs` order -> tuple of outputs."""
        return compile_source(self.source)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (see docs/profile-format.md)."""
        return {
            "key": self.key,
            "family": self.family,
            "ops": list(self.ops),
            "inputs": [m.to_json() for m in self.inputs],
            "outputs": [m.to_json() for m in self.outputs],
            "count": self.count,
            "bytes": self.bytes,
            "ms": self.ms,
            "share": self.share,
            "source": self.source,
            "module": self.module,
            "module_source": self.module_source,
        }

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Task:
        """Inverse of to_json; raises ValueError on a malformed entry."""
        try:
            return cls(
                key=str(d["key"]), family=str(d["family"]), ops=tuple(d["ops"]),
                inputs=tuple(TensorMeta.parse(m) for m in d["inputs"]),
                outputs=tuple(TensorMeta.parse(m) for m in d.get("outputs", [])),
                source=str(d["source"]), count=int(d["count"]),
                ms=None if d.get("ms") is None else float(d["ms"]),
                share=None if d.get("share") is None else float(d["share"]),
                module=str(d.get("module", "")), module_source=str(d.get("module_source", "")),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"Invalid task entry: missing or bad field {e}") from e


def compile_source(source: str) -> Callable[..., tuple[torch.Tensor, ...]]:
    """Execute a task's source and return its `region` function."""
    namespace: dict[str, Any] = {}
    exec(compile(source, "<forge task>", "exec"), namespace)  # noqa: S102 - our own rendering
    return namespace["region"]


def _literal(a: Any, names: dict[torch.fx.Node, str]) -> str:
    """Python text for one op argument."""
    if isinstance(a, torch.fx.Node):
        return names[a]
    if isinstance(a, (torch.dtype, torch.layout, torch.memory_format)):
        return str(a)
    if isinstance(a, torch.device):
        return "device"
    if isinstance(a, float):
        if math.isinf(a):
            return "float('inf')" if a > 0 else "float('-inf')"
        if math.isnan(a):
            return "float('nan')"
        return repr(a)
    if isinstance(a, (bool, int, str)) or a is None:
        return repr(a)
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_literal(x, names) for x in a)
        if isinstance(a, tuple):
            return f"({inner},)" if len(a) == 1 else f"({inner})"
        return f"[{inner}]"
    raise ValueError(f"cannot render argument {a!r} of type {type(a).__name__}")


def _callee(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        q = qualified_name(target)
        return "aten." + q.removeprefix("aten.") if q.startswith("aten.") else f"torch.ops.{q}"
    if getattr(operator, getattr(target, "__name__", ""), None) is target:
        return f"operator.{target.__name__}"
    raise ValueError(f"cannot render call to {target!r}")


@dataclass(frozen=True)
class Rendered:
    """One region occurrence rendered: its source and metadata, before grouping by key."""

    key: str
    family: str
    ops: tuple[str, ...]
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    source: str
    nodes: tuple[str, ...]
    input_nodes: tuple[str, ...]
    output_nodes: tuple[str, ...]


def canonical_order(region: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The region's nodes (given in graph order) in an order that follows what they compute, not where the
    graph put them: topological, ties broken by each node's structure (its op, its literal arguments, its
    inputs' structures, its value's shape, dtype and strides), then by its users' structures, then by graph
    position. Graphs of one model
    captured in two processes may order independent branches differently (Gemma 4's two rotary
    embeddings, made from a set iterated in string-hash order), and a task's source and key must not
    follow, or a run could not be resumed in another process."""
    members = set(region)
    sig: dict[torch.fx.Node, str] = {}
    for n in region:
        refs = {p: sig[p] if p in members else f"ext:{m.short() if (m := node_meta(p)) else p.op}"
                for p in n.all_input_nodes}
        try:
            args = [_literal(a, refs) for a in n.args] + [f"{k}={_literal(v, refs)}" for k, v in n.kwargs.items()]
        except ValueError:  # render refuses the region anyway
            return region
        meta = node_meta(n)
        text = f"{qualified_name(n.target)}({', '.join(args)}) {meta.short() if meta else ''}"
        sig[n] = hashlib.sha1(text.encode()).hexdigest()
    # and by what is made of them: two equal nodes (a subexpression the graph holds twice) that feed
    # different ops are told apart by those ops, so which of the two feeds which does not follow the graph
    down: dict[torch.fx.Node, str] = {}
    for n in reversed(region):
        uses = sorted(down[u] if u in members else "out" for u in n.users)
        down[n] = hashlib.sha1(" ".join([sig[n], *uses]).encode()).hexdigest()
    index = {n: i for i, n in enumerate(region)}
    waiting = {n: sum(p in members for p in n.all_input_nodes) for n in region}
    ready = [(sig[n], down[n], index[n], n) for n in region if waiting[n] == 0]
    heapq.heapify(ready)
    out: list[torch.fx.Node] = []
    while ready:
        n = heapq.heappop(ready)[3]
        out.append(n)
        for u in n.users:
            if u in members:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, (sig[u], down[u], index[u], u))
    return out


def _body(region: list[torch.fx.Node], names: dict[torch.fx.Node, str]) -> tuple[list[str], bool]:
    """The function's lines, one a node (its metadata as a comment), and whether a node takes a device."""
    body: list[str] = []
    uses_device = False
    for n in region:
        if n.target is operator.getitem:
            line = f"{names[n]} = {names[n.args[0]]}[{n.args[1]!r}]"
        else:
            args = [_literal(a, names) for a in n.args]
            args += [f"{k}={_literal(v, names)}" for k, v in n.kwargs.items()]
            uses_device |= any(isinstance(v, torch.device) for v in (*n.args, *n.kwargs.values()))
            line = f"{names[n]} = {_callee(n.target)}({', '.join(args)})"
        meta = node_meta(n)
        body.append(f"    {line}" + (f"  # {meta.short()}" if meta else ""))
    return body, uses_device


def region_source(region: list[torch.fx.Node]) -> Rendered:
    """Render one region (its nodes in graph order) as a standalone function, its body in the region's
    canonical order; raises ValueError when it cannot be rendered."""
    in_graph_order = region
    region = canonical_order(region)
    members = set(region)
    names: dict[torch.fx.Node, str] = {}
    ext: list[torch.fx.Node] = []
    for n in region:
        for p in n.all_input_nodes:
            if p not in members and p not in names:
                if node_meta(p) is None:
                    raise ValueError(f"region input {p.name} is not a tensor")
                names[p] = f"in{len(ext)}"
                ext.append(p)
    outs = [n for n in region if any(u not in members and not is_noop(u) for u in n.users)]
    for i, n in enumerate(region):
        names[n] = f"v{i}"
    body, uses_device = _body(region, names)
    for o in outs:
        if node_meta(o) is None:
            raise ValueError(f"region output {o.name} is not a tensor")
    in_metas = tuple(node_meta(p) for p in ext)
    params = ", ".join(f'{names[p]}: "{m.short()}"' for p, m in zip(ext, in_metas, strict=True))
    if uses_device:
        params += (", " if params else "") + "device: torch.device | None = None"
        first = "in0.device if device is None else device" if ext else "device or torch.device('cpu')"
        body.insert(0, f"    device = {first}")
    ret = ", ".join(names[o] for o in outs)
    targets = [n.target for n in region]
    header = SOURCE_HEADER + (f"{IMPORT}\n" if any(is_scan(t) for t in targets) else "")  # the op it calls
    source = f"{header}\n\ndef region({params}):\n" + "\n".join(body) + f"\n    return ({ret},)\n"
    primary = next((t for t in targets if kind_of(t) in (Kind.HEAVY, Kind.SINGLE, Kind.REDUCE)),
                   next((t for t in targets if t is not operator.getitem and kind_of(t) is not Kind.VIEW),
                        targets[0]))
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    return Rendered(
        key=f"{op_name(primary).lstrip('_')}-{digest}",
        family=family_of_region(targets, inverse_root=any(
            op_name(n.target) == "pow" and isinstance(n.args[-1], (int, float)) and n.args[-1] < 0
            for n in region)),
        ops=tuple(qualified_name(t) for t in targets),
        inputs=in_metas,  # type: ignore[arg-type]
        outputs=tuple(node_meta(o).written() for o in outs),  # type: ignore[union-attr]
        source=source,
        nodes=tuple(n.name for n in in_graph_order),  # dispatch inserts the kernel before the last
        input_nodes=tuple(p.name for p in ext),
        output_nodes=tuple(o.name for o in outs),
    )


def build_tasks(graph: torch.fx.Graph, node_ms: dict[str, float] | None = None,
                scope: Callable[[torch.fx.Node], str] | None = None) -> list[Task]:
    """Cut, render and group the graph's regions into tasks, sorted by time (or by first appearance);
    `scope`: regions do not cross it (forge.tasks.regions.cut)."""
    by_key: dict[str, list[Rendered]] = {}
    where: dict[str, tuple[str, str]] = {}
    for region in cut(graph, scope):
        r = region_source(region)
        by_key.setdefault(r.key, []).append(r)
        where.setdefault(r.key, scan_origin(region) or origin(region))
    total = sum(node_ms.values()) if node_ms else None
    tasks = []
    for key, occ in by_key.items():
        r = occ[0]
        ms = sum(node_ms.get(n, 0.0) for o in occ for n in o.nodes) if node_ms is not None else None
        share = (ms / total) if (ms is not None and total) else None
        tasks.append(Task(key, r.family, r.ops, r.inputs, r.outputs, r.source, len(occ), ms, share,
                          tuple(o.nodes for o in occ), *where[key]))
    if node_ms is not None:
        tasks.sort(key=lambda t: -(t.ms or 0.0))
    else:  # no times (meta capture): rank by the memory traffic of all occurrences
        tasks.sort(key=lambda t: -t.count * t.bytes)
    return tasks
