"""Capture: a model and its example inputs -> an ATen-level FX graph with real shapes, dtypes, strides.

The path is `torch.export.export(strict=False)` followed by `run_decompositions()` to core ATen, with
scaled-dot-product attention kept whole (it is one heavy op, not a softmax between two matmuls). Every
node carries `meta["val"]`, a FakeTensor whose shape, dtype and stride are the ones the op produces.
The dispatcher reuses the same exported program: it swaps captured regions for kernels in
`Capture.graph_module` and runs it. See docs/design.md.

Important: capture works on meta tensors (a model built under `torch.device("meta")`), so full-size
models are captured without memory; timing needs a real device (forge.capture.timing).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from forge.capture.libraries import as_eager
from forge.capture.scans import as_ops
from forge.errors import UserError

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TensorMeta:
    """Shape, dtype and stride of one tensor: what crosses process boundaries instead of a tensor."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "float32"
    stride: tuple[int, ...]

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        """The meta of a real or fake tensor."""
        return cls(tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch."),
                   tuple(int(s) for s in t.stride()))

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch.dtype this meta names."""
        return getattr(torch, self.dtype)

    @property
    def non_overlapping(self) -> bool:
        """No two elements share memory (a copy can be written into a tensor of this layout)."""
        span = 1
        for size, st in sorted((d for d in zip(self.shape, self.stride, strict=True) if d[0] > 1), key=lambda d: d[1]):
            if st < span:
                return False
            span = st * size
        return True

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (a broadcast or overlapping view counts its storage span once)."""
        span = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride, strict=True) if s > 0)
        if any(s == 0 for s in self.shape):
            span = 0
        return min(span, self.numel) * self.torch_dtype.itemsize

    @property
    def contiguous(self) -> bool:
        """Row-major (strides of size-1 dimensions do not matter): the layout kernels write most outputs in
        (see `written`)."""
        return all(st == c for s, st, c in zip(self.shape, self.stride, contiguous_stride(self.shape), strict=True)
                   if s != 1)

    @property
    def channels_last(self) -> bool:
        """A 4-d tensor laid out channels-last (NHWC), and not also row-major."""
        if len(self.shape) != 4 or self.contiguous:
            return False
        n, c, h, w = self.shape
        return all(st == e for s, st, e in zip(self.shape, self.stride, (h * w * c, 1, w * c, c), strict=True)
                   if s != 1)

    def written(self) -> TensorMeta:
        """The layout a kernel writes this output in: channels-last stays channels-last (how convolutions give
        and take 4-d activations, so that no copy sits between a kernel and a convolution), anything else is
        row-major."""
        if self.channels_last or self.contiguous:
            return self
        return TensorMeta(self.shape, self.dtype, contiguous_stride(self.shape))

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form: {"shape", "dtype", "stride"}."""
        return {"shape": list(self.shape), "dtype": self.dtype, "stride": list(self.stride)}

    @classmethod
    def parse(cls, d: dict[str, Any]) -> TensorMeta:
        """Inverse of to_json; raises ValueError on a malformed entry."""
        try:
            meta = cls(tuple(int(s) for s in d["shape"]), str(d["dtype"]), tuple(int(s) for s in d["stride"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"Invalid tensor meta: {d!r}") from e
        if not isinstance(getattr(torch, meta.dtype, None), torch.dtype):
            raise ValueError(f"Invalid tensor meta dtype: {meta.dtype!r}")
        if len(meta.shape) != len(meta.stride):
            raise ValueError(f"Invalid tensor meta (shape and stride differ in rank): {d!r}")
        return meta

    def short(self) -> str:
        """Compact text like "bf16[2048, 2304]", with the stride when not contiguous."""
        abbrev = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64", "int32": "i32",
                  "bool": "b8", "float64": "f64", "uint8": "u8", "int8": "i8"}
        s = f"{abbrev.get(self.dtype, self.dtype)}[{', '.join(map(str, self.shape))}]"
        if self.stride != contiguous_stride(self.shape):
            s += f" stride({', '.join(map(str, self.stride))})"
        return s


def output_view(flat: torch.Tensor, meta: TensorMeta) -> torch.Tensor:
    """The output `meta` describes over a flat buffer of its elements, in the layout kernels write it in
    (TensorMeta.written: dense, so the buffer holds exactly numel elements)."""
    return flat.as_strided(meta.shape, meta.written().stride)


def empty_output(meta: TensorMeta, device: Any) -> torch.Tensor:
    """A new tensor for the output `meta` describes, in the layout kernels write it in."""
    w = meta.written()
    return torch.empty_strided(w.shape, w.stride, dtype=w.torch_dtype, device=device)


def contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of a shape."""
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


@dataclass
class Capture:
    """An exported, decomposed model: the graph forge cuts into tasks and later patches."""

    exported: ExportedProgram
    graph_module: torch.fx.GraphModule
    seconds: float
    overrides: dict[str, torch.Tensor] = field(default_factory=dict)  # state-dict values in another layout
    layout: str = ""  # "" as exported, or the layout forge.capture.layout put the graph in ("channels-last")

    def flat_args(self, user_inputs: list[Any]) -> list[Any]:
        """Arguments of graph_module in placeholder order: parameters, buffers, constants, then inputs."""
        ep, args, users = self.exported, [], iter(user_inputs)
        for spec in ep.graph_signature.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                args.append(next(users))
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                args.append(self.overrides[spec.target] if spec.target in self.overrides
                            else ep.state_dict[spec.target] if spec.target in ep.state_dict
                            else ep.constants[spec.target])
            elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
                args.append(ep.constants[spec.target])
            else:
                raise UserError(f"unsupported graph input kind {spec.kind} for {spec.target}")
        return args

    def user_output_count(self) -> int:
        """Number of user-visible outputs."""
        return len(self.exported.graph_signature.user_outputs)

    def state_updates(self) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
        """((graph output index, the graph argument slot it writes back into) for every buffer the forward
        changes, such as the running statistics of a BatchNorm in training mode; the user outputs' indices).
        The graph is functional: whoever runs it writes the new buffers back, as eager changes them in place.
        Raises RuntimeError for outputs of other kinds (an input changed in place)."""
        ins, outs = self.exported.graph_signature.input_specs, self.exported.graph_signature.output_specs
        slot = {str(spec.target): i for i, spec in enumerate(ins) if spec.kind == InputKind.BUFFER}
        updates, users = [], []
        for j, spec in enumerate(outs):
            if spec.kind == OutputKind.USER_OUTPUT:
                users.append(j)
            elif spec.kind == OutputKind.BUFFER_MUTATION and str(spec.target) in slot:
                updates.append((j, slot[str(spec.target)]))
            else:
                raise RuntimeError(f"the model's forward has a graph output of kind {spec.kind.name} "
                                   f"({spec.target}): forge does not write it back")
        return tuple(updates), tuple(users)


def decomposition_table() -> dict[Any, Any]:
    """Core-ATen decompositions, minus the ops forge keeps whole (attention, logsumexp, activations)."""
    table = torch.export.default_decompositions()
    aten = torch.ops.aten
    # logsumexp would become two reductions (amax, sum) and so two tasks; softmax is kept whole too.
    # Activations that eager runs as one kernel stay one op: decomposed, each op is a pass over memory where
    # eager makes one (KernelBench level 2's conv + HardSwish + MaxPool + Mish on the H200: the decomposed
    # graph took 7.4 ms against eager's 4.6).
    for op in (aten.scaled_dot_product_attention.default, aten.logsumexp.default, aten.silu.default,
               aten.hardswish.default, aten.hardsigmoid.default, aten.mish.default):
        table.pop(op, None)
    return table


class _ThreadStderr:
    """sys.stderr for one thread's writes into `into` while `held`; the other threads' (a live progress
    display), and all once released, go on to `rest`, the stream it replaces, which answers everything else
    (fileno, encoding, isatty)."""

    def __init__(self, into: io.StringIO, rest: TextIO) -> None:
        self.into, self.rest, self.owner, self.held = into, rest, threading.get_ident(), True

    def write(self, s: str) -> int:
        return (self.into if self.held and threading.get_ident() == self.owner else self.rest).write(s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rest, name)


@contextlib.contextmanager
def _this_thread_stderr(into: io.StringIO) -> Iterator[None]:
    """This thread's writes to sys.stderr go into `into` for the block. Released at its end even where another
    thread has put its own stream over it meanwhile (that one is left in place, passing writes through)."""
    held = _ThreadStderr(into, sys.stderr)
    sys.stderr = held
    try:
        yield
    finally:
        held.held = False
        if sys.stderr is held:
            sys.stderr = held.rest


def capture(model: torch.nn.Module, inputs: list[Any]) -> Capture:
    """Export `model` on `inputs` (real or meta tensors) to a decomposed ATen graph."""
    start = time.perf_counter()
    printed = io.StringIO()  # torch.export prints a failed trace's partial graph to stderr (twice) before it raises
    try:
        # the graph of what eager runs (forge.capture.libraries), library loops as one op each (forge.capture.scans)
        with torch.no_grad(), as_eager(), as_ops(), _this_thread_stderr(printed):
            ep = torch.export.export(model, tuple(inputs), strict=False)
            ep = ep.run_decompositions(decomposition_table())
    except Exception as e:  # torch.export raises many kinds; the user needs the first line
        log.debug("torch.export printed before it raised:\n%s", printed.getvalue())
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ("; forge takes the whole forward as one graph, and a Python branch on a tensor's value is not one "
                "(torch.cond, or the branch outside Model)") if "DataDependent" in type(e).__name__ else ""
        raise UserError(f"could not capture the model with torch.export: {type(e).__name__}: {first}{hint}") from e
    sys.stderr.write(printed.getvalue())  # what it printed on the way to a graph is the user's to see
    seconds = time.perf_counter() - start
    gm = ep.graph_module
    n = sum(1 for node in gm.graph.nodes if node.op == "call_function")
    log.info("captured %d ATen nodes in %.1f s", n, seconds)
    return Capture(ep, gm, seconds)


def node_meta(node: torch.fx.Node) -> TensorMeta | None:
    """The TensorMeta of a node's value, or None when it is not a single tensor."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return TensorMeta.of(val)
    return None
