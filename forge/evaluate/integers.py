"""Integer inputs: which may be negative, and their values (forge.evaluate.verify draws the sets).

An integer input used as an index (embedding, gather, index_select, scatter, a sort's indices...) must stay
a valid index: outside [0, 16) it could fail eager (a reference error) or, on a GPU, raise a device-side
assertion in forge's own process. An input whose every use, and every use of what is computed from it,
is arithmetic, comparison, a cast, a view or a reduction on which negatives are defined (SIGNED_OK) gets
signed values: a kernel that assumes non-negative integers (an `abs` left out, C's truncating `/` and `%`
where torch floors) is judged on them. The rest keep [0, 16).
"""

from __future__ import annotations

import ast

import torch

# aten ops (packet names) whose integer operands may be negative: neither an index nor an exponent or a
# shift count (pow and the shifts are undefined or refused there).
SIGNED_OK = frozenset({
    "add", "sub", "rsub", "mul", "neg", "abs", "sign", "eq", "ne", "lt", "le", "gt", "ge", "where",
    "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "div", "floor_divide", "remainder", "fmod",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_not",
    "logical_xor", "_to_copy", "to", "clone", "alias", "contiguous", "detach", "view", "reshape",
    "_unsafe_view", "unsqueeze", "squeeze", "permute", "expand", "t", "transpose", "slice", "select",
    "flatten", "sum", "amax", "amin",
})
SMALL = 16  # integers are drawn from [0, SMALL), or [-SMALL, SMALL) where signed
LARGE = 1024  # the hard set's largest signed magnitude (int32 and int64): exact in float32 products


def signed_inputs(source: str) -> frozenset[int]:
    """Positions of the `region` arguments in a task's source whose values may be negative (see the module
    doc); positions of floating-point inputs may be among them (they are signed anyway)."""
    tree = ast.parse(source)
    region = next((f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "region"), None)
    if region is None:
        return frozenset()
    origin = {a.arg: {i} for i, a in enumerate(region.args.args)}  # a value -> the inputs it comes from
    unsafe: set[int] = set()
    for stmt in region.body:
        if not isinstance(stmt, ast.Assign) or not isinstance(stmt.value, ast.Call):
            continue
        used = set().union(*(origin.get(n.id, set()) for n in ast.walk(stmt.value) if isinstance(n, ast.Name)))
        if _op(stmt.value.func) not in SIGNED_OK:
            unsafe |= used
        for target in stmt.targets:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    origin[n.id] = used
    return frozenset(range(len(region.args.args))) - unsafe


def _op(func: ast.expr) -> str:
    """`aten.mul.Tensor` -> "mul"; anything else (operator.getitem, a name) -> its own text."""
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and \
            isinstance(func.value.value, ast.Name) and func.value.value.id == "aten":
        return func.value.attr
    return ast.unparse(func)


def integers(span: int, dtype: torch.dtype, hard: bool, signed: bool, gen: torch.Generator) -> torch.Tensor:
    """`span` integers of `dtype` (made on the generator's device): [0, SMALL), or for a `signed` input of a
    signed dtype [-SMALL, SMALL), and in the `hard` set an eighth zeros and (32- and 64-bit) an eighth of
    magnitude 64 to LARGE, either sign."""
    dev = gen.device
    if not signed or not dtype.is_signed:
        return torch.randint(0, SMALL, (span,), generator=gen, device=dev)
    x = torch.randint(-SMALL, SMALL, (span,), generator=gen, device=dev)
    if not hard:
        return x
    kind = torch.randint(0, 8, (span,), generator=gen, device=dev)
    x = torch.where(kind == 0, torch.zeros_like(x), x)
    if torch.iinfo(dtype).bits >= 32:
        big = torch.randint(64, LARGE + 1, (span,), generator=gen, device=dev)
        sign = torch.randint(0, 2, (span,), generator=gen, device=dev) * 2 - 1
        x = torch.where(kind == 1, sign * big, x)
    return x
