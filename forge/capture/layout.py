"""The layout a capture is put in before it is cut into tasks: channels-last for convolutional models.

`channels_last(cap, inputs)` is a new Capture of the same graph whose 4-d convolution weights are
channels-last, so that cuDNN and oneDNN run NHWC and the ops after them see NHWC tensors. Every node's
value metadata is then refreshed by running the graph (on the inputs' device: real strides, not a
model of them; meta inputs give meta strides), so the tasks cut from it, their kernels and their guards
are for the layout the forward really has: a GroupNorm region gets channels-last inputs and outputs.
Two things are made explicit nodes. A GroupNorm whose input is not row-major reads a row-major copy of
it (what `F.group_norm` does on CUDA, where `native_group_norm` takes nothing else; the same graph on
CPU and CUDA alike, so that tasks cut on the CPU are those of the GPU; meta convolutions report row-major
outputs, so a meta capture has no such copies), and its output is copied back
to channels-last when its input was channels-last (the convolution after it stays NHWC; forge's NHWC
GroupNorm kernel reads and writes channels-last through both copies). 4-d graph outputs that were
row-major are made row-major again (a user may `view` them).

`choose(cap, inputs, device)` is the decision, measured: "channels-last" when the model has 4-d
convolutions, its forward in that layout computes what row-major's does, and it is faster than row-major by
more than the noise (the two forwards interleaved in this process), else "" (the capture as it is). The
forwards timed are the two graphs with each GroupNorm (and the copies around it) stood in for by one
pass over its input, read in its layout and written in the layout of the GroupNorm's output
(`without_norms`): forge replaces GroupNorms with a kernel that reads and writes either layout at the
same cost, so eager's own GroupNorm (row-major only on CUDA, hence two copies in channels-last) would
decide the layout by what forge does not run. What is decided is recorded with the run and the artifact,
so `--resume` and `forge.load` capture the same graph.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import replace
from typing import Any

import torch
import torch.fx
from torch._prims_common import suggest_memory_format
from torch.export.graph_signature import InputKind

from forge.capture.export import Capture, capture
from forge.runtime.endtoend import compare, interleaved_ms

log = logging.getLogger(__name__)
aten = torch.ops.aten

LAYOUTS = ("", "channels-last")
CHOICES = ("auto", "row-major", "channels-last")  # what a user names (forge optimize --layout)
_COPY = "forge_layout_copy"  # node meta: a copy channels_last made ("in": a GroupNorm's input, "back": its output)
GAIN = 0.99  # the layout is changed only when the forward gets under 99% of row-major's time
_CONVS = (aten.convolution.default,)


def conv_weights(cap: Capture) -> list[str]:
    """Names (state-dict targets) of the parameters that are 4-d convolution weights."""
    targets = {spec.arg.name: spec.target for spec in cap.exported.graph_signature.input_specs
               if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER)}
    names = []
    for node in cap.graph_module.graph.nodes:
        if node.op == "call_function" and node.target in _CONVS and isinstance(node.args[1], torch.fx.Node):
            w = node.args[1]
            val = w.meta.get("val")
            if w.op == "placeholder" and w.name in targets and isinstance(val, torch.Tensor) and val.dim() == 4:
                names.append(targets[w.name])
    return list(dict.fromkeys(names))


def capture_in(model: torch.nn.Module, inputs: list[Any], layout: str = "") -> Capture:
    """forge.capture.export.capture of `model` on `inputs`, in `layout`."""
    return apply(capture(model, inputs), layout, inputs)


def requested(choice: str) -> str | None:
    """The layout argument forge.job.optimize takes for a user's choice (CHOICES): None for "auto" (measured), ""
    for "row-major" (the capture as it is)."""
    return {"auto": None, "row-major": ""}.get(choice, choice)


def apply(cap: Capture, layout: str, inputs: list[Any]) -> Capture:
    """`cap` in `layout` ("" leaves it as it is); ValueError on an unknown layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"Invalid layout {layout!r}: choose from {', '.join(repr(x) for x in LAYOUTS)}")
    return channels_last(cap, inputs) if layout == "channels-last" else cap


def channels_last(cap: Capture, inputs: list[Any]) -> Capture:
    """A copy of `cap` with channels-last convolution weights and refreshed metadata (see the module doc)."""
    state = cap.exported.state_dict
    overrides = dict(cap.overrides)
    for name in conv_weights(cap):
        w = overrides.get(name, state.get(name))
        if isinstance(w, torch.Tensor):
            overrides[name] = w.detach().contiguous(memory_format=torch.channels_last)
    gm = torch.fx.GraphModule(cap.graph_module, _copy_graph(cap.graph_module.graph))
    out = replace(cap, graph_module=gm, overrides=overrides, layout="channels-last")
    was_row_major = _row_major_outputs(gm)
    refresh = _Refresh(gm)
    with torch.no_grad():
        refresh.run(*out.flat_args(inputs))
    for norm, fmt in refresh.fix.items():
        _norm_through_copies(gm, norm, fmt)
    _outputs_row_major(gm, was_row_major)
    gm.graph.lint()
    gm.recompile()
    log.info("capture in channels-last: %d convolution weights, %d GroupNorm inputs copied", len(overrides),
             len(refresh.fix))
    return out


def _norm_through_copies(gm: torch.fx.GraphModule, norm: torch.fx.Node, fmt: torch.memory_format) -> None:
    """`norm` reads a row-major copy of its input; its output is copied to `fmt` when that is channels-last."""
    x = norm.args[0]
    with gm.graph.inserting_before(norm):
        c = gm.graph.call_function(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
    c.meta = {"val": x.meta["val"].contiguous(), _COPY: "in"}
    norm.replace_input_with(x, c)
    if fmt is not torch.channels_last:
        return
    for g in [u for u in norm.users if u.target is operator.getitem and u.args[1] == 0]:
        if any(u.op != "output" for u in g.users):  # a graph output stays the norm's own, row-major
            with gm.graph.inserting_after(g):
                back = gm.graph.call_function(aten.clone.default, (g,), {"memory_format": fmt})
            g.replace_all_uses_with(back, delete_user_cb=lambda u, back=back: u is not back and u.op != "output")
            back.meta = {"val": g.meta["val"], _COPY: "back"}  # what the refresh recorded: the channels-last copy
        g.meta = {**g.meta, "val": g.meta["val"].contiguous()}


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of `graph` whose nodes carry copies of the originals' meta (the refresh rewrites them)."""
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph.nodes:
        env[node] = new.node_copy(node, lambda n: env[n])
        env[node].meta = dict(node.meta)
    return new


def _row_major_outputs(gm: torch.fx.GraphModule) -> list[bool]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [isinstance(v := getattr(a, "meta", {}).get("val"), torch.Tensor) and v.is_contiguous()
            for a in out.args[0]]


def _outputs_row_major(gm: torch.fx.GraphModule, was: list[bool]) -> None:
    """Graph outputs that were row-major and no longer are: a row-major copy (a `clone` node)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    fixed = []
    for a, row_major in zip(out.args[0], was, strict=True):
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if row_major and isinstance(val, torch.Tensor) and not val.is_contiguous():
            with gm.graph.inserting_before(out):
                c = gm.graph.call_function(aten.clone.default, (a,), {"memory_format": torch.contiguous_format})
            c.meta = {**a.meta, "val": val.contiguous()}
            a = c
        fixed.append(a)
    out.args = (type(out.args[0])(fixed),)


def _meta_of(v: Any) -> Any:
    """A meta tensor with v's shape, strides and dtype (a tensor's value is not metadata), else v."""
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, (tuple, list)):
        return type(v)(_meta_of(x) for x in v)
    return v


class _Refresh(torch.fx.Interpreter):
    """Runs the graph and records every node's value as its metadata; a GroupNorm whose input is not row-major
    runs on a row-major copy, its output copied back to channels-last when the input was, and is noted in `fix`
    with the layout its input suggests."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.fix: dict[torch.fx.Node, torch.memory_format] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_function" and n.target is aten.native_group_norm.default:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            x = args[0]
            if not x.is_contiguous():
                fmt = self.fix[n] = suggest_memory_format(x)
                out = n.target(x.contiguous(), *args[1:], **kwargs)
                n.meta["val"] = _meta_of(out)
                if fmt is not torch.channels_last:  # only a 4-d channels-last input's output is copied back
                    return out
                return (out[0].contiguous(memory_format=fmt), *out[1:])
        out = super().run_node(n)
        if n.op != "output":
            n.meta["val"] = _meta_of(out)
        return out


def choose(cap: Capture, inputs: list[Any], device: str) -> str:
    """The layout to capture in (see the module doc); "" when nothing else is faster or applies."""
    if device == "meta" or not conv_weights(cap):
        return ""
    try:
        cl = channels_last(cap, inputs)
        plain_args, cl_args = cap.flat_args(inputs), cl.flat_args(inputs)
        row_gm, cl_gm = without_norms(cap.graph_module), without_norms(cl.graph_module)
        with torch.no_grad():
            tf32 = device.startswith("cuda") and torch.backends.cudnn.allow_tf32  # forge.tolerance.model_tolerance
            ok, err = compare(cap.graph_module(*plain_args), cl.graph_module(*cl_args), tf32)
            row_ms, cl_ms = interleaved_ms(lambda: row_gm(*plain_args), lambda: cl_gm(*cl_args),
                                           device, runs=9, warmup=2)
    except Exception as e:  # noqa: BLE001 - a layout that cannot run is not chosen, the capture stays as it is
        log.warning("channels-last capture not usable: %s: %s", type(e).__name__, e)
        return ""
    keep = ok and cl_ms < row_ms * GAIN
    log.info("layout: row-major %.3f ms, channels-last %.3f ms, GroupNorms stood in for (outputs %s, error %.2g): "
             "%s", row_ms, cl_ms,
             "match" if ok else "differ", err, "channels-last" if keep else "row-major")
    return "channels-last" if keep else ""


def without_norms(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` whose GroupNorms (only their normalized output used) are each one pass over the input they
    normalize, read in its layout and written in the layout the GroupNorm's output has in `gm` (a `clone` in
    that memory format), without the copies channels_last puts around them; for timing layouts against each
    other, not for its values."""
    g = _copy_graph(gm.graph)
    for n in [n for n in g.nodes if n.target is aten.native_group_norm.default]:
        outs = [u for u in n.users if u.users]
        if not all(u.target is operator.getitem and u.args[1] == 0 for u in outs):
            continue  # the statistics are used: this one is timed as it is
        x = n.args[0]
        if x.meta.get(_COPY) == "in":
            x = x.args[0]
        backs = [b for u in outs for b in u.users if b.meta.get(_COPY) == "back"]
        fmt = torch.channels_last if backs else torch.contiguous_format
        with g.inserting_before(n):
            stand_in = g.call_function(aten.clone.default, (x,), {"memory_format": fmt})
        for b in backs:
            b.replace_all_uses_with(stand_in)
        for u in outs:
            u.replace_all_uses_with(stand_in)
    g.eliminate_dead_code()
    return torch.fx.GraphModule(gm, g)

