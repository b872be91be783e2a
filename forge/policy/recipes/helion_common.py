"""What the Helion recipes share: the knobs, the emitter that writes the recipes' lowering as PyTorch ops on Helion
tiles, the kernel decorator with its config, and the launcher. See forge.policy.recipes.helion_kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge.capture.export import TensorMeta
from forge.kernel import TaskSpec
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.index import Expr
from forge.policy.recipes.triton_common import TritonEmitter, guard, lit, texpr

PRELUDE = "import helion\nimport helion.language as hl\nimport torch\n"


@dataclass(frozen=True)
class HelionKnobs:
    """Pointwise: the Helion config (elements per tile, warps, pipeline stages)."""

    block: int = 1024
    warps: int = 4
    stages: int = 1


@dataclass(frozen=True)
class HelionRowKnobs:
    """Rows: what Helion's autotuner does not choose, `passes` (1: the row held whole in one tile; 2: walked in
    chunks for the statistics, then again for the epilogue) and `acc64` (the statistics summed in float64), and the
    config: rows per tile, elements per chunk (two passes), warps, pipeline stages."""

    passes: int = 1
    rows: int = 1
    chunk: int = 1024
    warps: int = 4
    stages: int = 1
    acc64: bool = False


_UNARY = {
    "exp": "torch.exp({a})", "log": "torch.log({a})", "sqrt": "torch.sqrt({a})", "rsqrt": "torch.rsqrt({a})",
    "sigmoid": "torch.sigmoid({a})", "tanh": "torch.tanh({a})", "neg": "(-{a})", "abs": "torch.abs({a})",
    "relu": "torch.relu({a})", "erf": "torch.erf({a})", "log1p": "torch.log1p({a})", "expm1": "torch.expm1({a})",
    "reciprocal": "(1.0 / {a})", "sin": "torch.sin({a})", "cos": "torch.cos({a})",
    "silu": "({a} * torch.sigmoid({a}))", "logical_not": "({a} == 0.0).to(torch.float32)",
    "bitwise_not": "({a} == 0.0).to(torch.float32)", "floor": "torch.floor({a})", "ceil": "torch.ceil({a})",
    "sign": "torch.sign({a})", "exp2": "torch.exp2({a})", "log2": "torch.log2({a})",
    "isnan": "({a} != {a}).to(torch.float32)",
    "hardsigmoid": "(torch.clamp({a} + 3.0, 0.0, 6.0) / 6.0)",
    "hardswish": "({a} * torch.clamp({a} + 3.0, 0.0, 6.0) / 6.0)",
    "mish": "({a} * torch.tanh(torch.log1p(torch.exp({a}))))",
}
_BINARY = {"mul": "({a} * {b})", "div": "({a} / {b})", "maximum": "torch.maximum({a}, {b})",
           "minimum": "torch.minimum({a}, {b})", "pow": "torch.pow({a}, {b})",
           "eq": "({a} == {b}).to(torch.float32)", "ne": "({a} != {b}).to(torch.float32)",
           "lt": "({a} < {b}).to(torch.float32)", "le": "({a} <= {b}).to(torch.float32)",
           "gt": "({a} > {b}).to(torch.float32)", "ge": "({a} >= {b}).to(torch.float32)",
           "logical_and": "(({a} != 0.0) & ({b} != 0.0)).to(torch.float32)",
           "logical_or": "(({a} != 0.0) | ({b} != 0.0)).to(torch.float32)",
           "bitwise_and": "(({a} != 0.0) & ({b} != 0.0)).to(torch.float32)",
           "bitwise_or": "(({a} != 0.0) | ({b} != 0.0)).to(torch.float32)"}
_FORMS = {
    "one": "1.0", "zero": "0.0", "select": "torch.where({c} != 0.0, {a}, {b})",
    "max": "torch.clamp_min({a}, {b})", "min": "torch.clamp_max({a}, {b})",  # b: a constant bound
    "leaky": "torch.where({a} > 0.0, {a}, {s} * {a})",
    "gelu": "(0.5 * {a} * (1.0 + torch.erf({a} * 0.7071067811865476)))",
    "gelu_tanh": "(0.5 * {a} * (1.0 + torch.tanh(0.7978845608028654 * ({a} + 0.044715 * {a} * {a} * {a}))))",
    "round_bf16": "({a}).to(torch.bfloat16).to(torch.float32)",
    "round_f16": "({a}).to(torch.float16).to(torch.float32)",
    "to_bool": "({a} != 0.0).to(torch.float32)", "exp": "torch.exp({a})", "log": "torch.log({a})",
}
TORCH_DTYPES = {torch.float32: "torch.float32", torch.float16: "torch.float16", torch.bfloat16: "torch.bfloat16",
                torch.uint8: "torch.uint8", torch.bool: "torch.bool"}


class HelionEmitter(TritonEmitter):
    """The recipes' lowering (forge.policy.recipes.emit) as PyTorch ops on Helion tiles, in float32.

    Inputs are flat views (the launcher's), read at the lowering's offsets: an index tensor built from the tiles'
    indices, a gather that Helion lowers to a masked load. Helion masks loads, stores and reductions at the tiles'
    edges itself. `block`, `vectors`: as for Triton (which values vary along the tile, for stores of the others).
    """

    UNARY = _UNARY
    BINARY = _BINARY
    FORMS = _FORMS

    def raw_load(self, i: int, off: Expr) -> str:
        return f"in{i}[{texpr(off)}]"

    def as_float(self, raw: str, dtype: torch.dtype) -> str:
        if dtype == torch.float64:
            raise NotMine("float64: the Helion recipes compute in float32")
        return f"{raw}.to(torch.float32)"

    def power(self, a: str, e: float) -> str:
        if e == int(e) and 0 <= abs(e) <= 8:  # a small whole power: multiplications, as eager's pow does
            prod = " * ".join([a] * int(abs(e))) or "1.0"
            return f"(1.0 / ({prod}))" if e < 0 else f"({prod})"
        if e == 0.5:
            return f"torch.sqrt({a})"
        return f"torch.pow({a}, {lit(e)})"


def store(j: int, m: TensorMeta, at: str, value: str, em: HelionEmitter, spread: str = "") -> str:
    """The statement storing `value` (float32) as output `j`'s dtype at offset `at`; `spread`: an index tensor of
    the store's shape that a value constant along it is broadcast over first ("" for a per-row store)."""
    v = value if em.is_vector(value) or not spread else f"({value} + ({spread} * 0).to(torch.float32))"
    dtype = m.torch_dtype
    if dtype == torch.bool:
        v = f"({v} != 0.0)"
    elif dtype in (torch.float16, torch.bfloat16, torch.uint8):
        v = f"({v}).to({TORCH_DTYPES[dtype]})"
    elif dtype != torch.float32:
        raise NotMine(f"stores {dtype}")
    return f"out{j}[{at}] = {v}"


def decorator(block_sizes: list[int], knobs: HelionKnobs | HelionRowKnobs, wide: bool) -> str:
    """`@helion.kernel(...)` with the candidate's one config (Helion never autotunes it: the source is what runs, is
    stored and is exported); static shapes (one kernel per shape, as every recipe is); 64-bit indices where an
    offset may pass 2^31."""
    wide_index = ", index_dtype=torch.int64" if wide else ""
    return (f"@helion.kernel(config=helion.Config(block_sizes={block_sizes}, num_warps={knobs.warps}, "
            f"num_stages={knobs.stages}), static_shapes=True{wide_index})\n")


def signature(spec: TaskSpec) -> str:
    """The kernel's parameters: the flat views of the inputs, then of the outputs."""
    return ", ".join([f"in{i}: torch.Tensor" for i in range(len(spec.inputs))]
                     + [f"out{j}: torch.Tensor" for j in range(len(spec.outputs))])


def _extent(m: TensorMeta) -> int:
    """Elements from a tensor's first to its last (what its flat view spans)."""
    return max(1, 1 + sum((s - 1) * abs(st) for s, st in zip(m.shape, m.stride, strict=True)))


def launcher(spec: TaskSpec, kernel: str) -> str:
    """`launch(inputs, outputs)`: the guards (1: wrong counts, 2: other tensors), then the kernel on flat views
    (`as_strided` keeps each tensor's storage offset; outputs are dense in the layout they are written)."""
    views = [f"inputs[{i}].as_strided(({_extent(m)},), (1,))" for i, m in enumerate(spec.inputs)]
    views += [f"outputs[{j}].as_strided(({_extent(m.written())},), (1,))" for j, m in enumerate(spec.outputs)]
    return (f"def launch(inputs, outputs):\n"
            f"    if len(inputs) != {len(spec.inputs)} or len(outputs) != {len(spec.outputs)}:\n        return 1\n"
            f"    if {guard(spec)}:\n        return 2\n"
            f"    {kernel}({', '.join(views)})\n    return 0\n")

