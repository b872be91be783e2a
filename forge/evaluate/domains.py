"""Input domains: where a task's computation is defined, so that verification draws its inputs there.

Most tasks are judged on any finite values (and the hard ones: zeros, exp's overflow edge, large magnitudes). A
scan (forge.capture.scans) is a recurrence whose inputs have a domain: the gated delta rule's decay `g` is a log
(the state is multiplied by exp(g) every step, so g <= 0) and its `beta` a rate in (0, 1). Outside it the state
grows without bound over a few chunks, the triangular system each chunk solves is as badly conditioned, and two
right implementations agree on nothing (nor does eager with itself in higher precision). So an input that reaches
such an argument, directly or through views, is drawn as usual and then mapped into the domain (`into`): the
scales, the hard values (zeros and saturated rates included) and the spot checks' perturbations all stay in it.
"""

from __future__ import annotations

import ast

import torch

from forge.capture.scans import DOMAINS, NAMESPACE, PARAMS

# aten ops (packet names) that only view their first operand: an input keeps its domain through them
_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "slice", "select", "permute", "transpose", "t", "expand",
                    "unsqueeze", "squeeze", "alias", "clone", "contiguous", "detach", "flatten"})


def input_domains(source: str) -> dict[int, str]:
    """Positions of the `region` arguments of a task's source that have a domain (module doc), and its name."""
    tree = ast.parse(source)
    region = next((f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "region"), None)
    if region is None:
        return {}
    origin = {a.arg: i for i, a in enumerate(region.args.args)}  # a value -> the input it is a view of
    found: dict[int, str] = {}
    for stmt in region.body:
        if not isinstance(stmt, ast.Assign) or not isinstance(stmt.value, ast.Call):
            continue
        call, op = stmt.value, _op(stmt.value.func)
        if op.startswith(f"{NAMESPACE}."):
            for name, arg in zip(PARAMS, call.args, strict=False):
                if name in DOMAINS and isinstance(arg, ast.Name) and arg.id in origin:
                    found[origin[arg.id]] = DOMAINS[name]
        elif op in _VIEWS and call.args and isinstance(call.args[0], ast.Name) and call.args[0].id in origin:
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    origin[target.id] = origin[call.args[0].id]
    return found


def _op(func: ast.expr) -> str:
    """`aten.view.default` -> "view"; `torch.ops.forge_scan.x.default` -> "forge_scan.x"; else its text."""
    text = ast.unparse(func)
    if text.startswith("aten."):
        return text.split(".")[1]
    return text.removeprefix("torch.ops.").removesuffix(".default")


def into(x: torch.Tensor, domain: str) -> torch.Tensor:
    """Floating-point values mapped into `domain` ("" leaves them): "nonpositive" -|x|, "unit" sigmoid(x)."""
    if domain == "nonpositive":
        return -x.abs()
    if domain == "unit":
        return torch.sigmoid(x)
    if domain:
        raise ValueError(f"Invalid input domain: {domain!r}")
    return x
