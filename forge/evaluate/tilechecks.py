"""Static rules for kernels that compute with PyTorch ops on tiles (Helion): where torch may appear, and what else.

A Helion kernel's body is two programs: the host part (statements outside its `hl.tile`/`hl.grid` loops), which
Helion runs as eager PyTorch on every call, and the device loops, which Helion traces and lowers to Triton. PyTorch
ops in the device loops are the kernel's own arithmetic on tiles (Helion never calls ATen there); in the host part
they would be ATen compute outside the kernel. So:

- the host part holds only a docstring, literal constants, `hl.register_block_size`/`hl.register_tunable`, a bare
  `return`, and the device loops themselves, whose ranges call no torch;
- in the device loops, calls are `torch.<op>` (one level: no `torch.ops.aten...`, `torch.cuda...`), `hl.<op>` from
  the tile vocabulary below, tensor methods, and plain builtins; no private names;
- `helion.kernel(...)` takes one `config=` and otherwise only static shapes and the index dtype: without a config
  Helion's autotuner would run in the worker (compiles in other processes, minutes a kernel) and the config it
  chose would not be in the source that is stored and exported; `ref_mode` would run the kernel as eager PyTorch,
  the logging settings write files.
"""

from __future__ import annotations

import ast

from forge.kernel import Status

Finding = tuple[Status, str]

LOOPS = {"tile", "grid"}  # hl.tile / hl.grid: a device loop
HOST_CALLS = {"register_block_size", "register_tunable"}
# hl's tile vocabulary in device code (not breakpoint, device_print, the distributed ops, triton_kernel)
TILE_OPS = LOOPS | HOST_CALLS | {
    "static_range", "full", "zeros", "arange", "load", "store", "reduce", "associative_scan", "cumsum", "cumprod",
    "dot", "tile_index", "tile_begin", "tile_end", "tile_block_size", "tile_id", "specialize", "subscript", "split",
    "join", "rand", "randint", "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor",
    "atomic_xchg", "atomic_cas", "inline_asm_elementwise"}
# torch functions with effects beyond a value (state, files, allocation on the host)
TORCH_DENY = {"save", "load", "compile", "manual_seed", "seed", "set_default_dtype", "set_default_device",
              "set_grad_enabled", "use_deterministic_algorithms", "set_num_threads", "set_printoptions", "from_file",
              "set_float32_matmul_precision", "set_flush_denormal", "set_rng_state", "get_rng_state", "cuda",
              "ops", "library", "utils", "distributed", "backends", "fx", "jit", "hub", "classes", "autograd"}
BUILTINS = {"float", "int", "min", "max", "abs", "range", "len", "bool"}
KERNEL_SETTINGS = {"config", "static_shapes", "index_dtype"}


def dotted(node: ast.AST) -> str:
    """`a.b.c` of a name or attribute chain, else ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _aliases(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names helion.language and torch are bound to at import."""
    hl, torch = {"helion.language"}, set()
    for n in tree.body:
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name == "helion.language":
                    hl.add(a.asname or a.name)
                elif a.name == "torch":
                    torch.add(a.asname or "torch")
        elif isinstance(n, ast.ImportFrom) and n.module == "helion":
            hl.update(a.asname or a.name for a in n.names if a.name == "language")
    return hl, torch


def _where(node: ast.AST) -> str:
    return f" (line {getattr(node, 'lineno', '?')})"


def _hl_op(name: str, hl: set[str]) -> str:
    """The op of `hl.<op>` (through any alias of helion.language), else ""."""
    head, _, op = name.rpartition(".")
    return op if head in hl else ""


def _host(stmt: ast.stmt, hl: set[str], torch: set[str]) -> list[Finding]:
    """A statement of a kernel's host part: what it may be (see the module doc)."""
    where = _where(stmt)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return []
    if isinstance(stmt, ast.Return) and (stmt.value is None or isinstance(stmt.value, ast.Constant)):
        return []
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        v = stmt.value
        if isinstance(v, ast.Constant) or (isinstance(v, ast.Call) and _hl_op(dotted(v.func), hl) in HOST_CALLS):
            return []
    if isinstance(stmt, ast.For) and isinstance(stmt.iter, ast.Call) and _hl_op(dotted(stmt.iter.func), hl) in LOOPS:
        found = [(Status.FORBIDDEN_TORCH, f"calls `{dotted(n.func)}(...)` in a device loop's range, which runs "
                  f"on the host{where}") for n in ast.walk(stmt.iter) if isinstance(n, ast.Call) and
                 dotted(n.func).split(".")[0] in torch]
        return found + [f for s in stmt.body for f in _device(s, hl, torch)]
    uses_torch = any(isinstance(n, ast.Name) and n.id in torch for n in ast.walk(stmt))
    status = Status.FORBIDDEN_TORCH if uses_torch else Status.FORBIDDEN_CODE
    return [(status, f"runs `{ast.unparse(stmt).splitlines()[0][:60]}` in a kernel's host part (outside its "
             f"hl.tile/hl.grid loops: only loops, constants and block sizes there){where}")]


def _device(stmt: ast.stmt, hl: set[str], torch: set[str]) -> list[Finding]:
    """The calls and names of a statement in a device loop."""
    found: list[Finding] = []
    modules = hl | torch | {"helion"}
    bases = {id(n.value) for n in ast.walk(stmt) if isinstance(n, ast.Attribute)}
    for node in ast.walk(stmt):
        where = _where(node)
        if isinstance(node, ast.Name) and node.id in modules and id(node) not in bases:
            found.append((Status.FORBIDDEN_CODE, f"binds the module `{node.id}` to a name in a kernel{where}"))
        elif isinstance(node, ast.Attribute):
            parts = dotted(node).split(".")
            if parts[0] in torch and (len(parts) > 2 or parts[1].startswith("_") or parts[1] in TORCH_DENY):
                found.append((Status.FORBIDDEN_CODE, f"reaches `{dotted(node)}` in a kernel (only `torch.<op>` "
                              f"and dtypes){where}"))
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            head = name.split(".")[0]
            method = isinstance(node.func, ast.Attribute) and head not in modules  # x.to(...), (a > b).to(...)
            if head in torch or name in BUILTINS or method:
                continue  # torch.<op>: its chain is checked as an attribute
            if _hl_op(name, hl) not in TILE_OPS:
                allowed = f"torch ops, tile ops of helion.language, tensor methods and {', '.join(sorted(BUILTINS))}"
                found.append((Status.FORBIDDEN_CODE, f"calls `{name or ast.unparse(node.func)}(...)` in a kernel "
                              f"({allowed} only){where}"))
    return found


def _settings(tree: ast.Module, kernel_defs: set[ast.AST], kernels: tuple[str, ...]) -> list[Finding]:
    """Every kernel decorator is a call with one `config=` and only the ABI's other settings."""
    found: list[Finding] = []
    decorators = [d for fn in kernel_defs for d in fn.decorator_list]  # type: ignore[attr-defined]
    for node in decorators:
        if not isinstance(node, ast.Call) or "config" not in [kw.arg for kw in node.keywords]:
            found.append((Status.FORBIDDEN_CODE, f"`{ast.unparse(node)[:60]}` names no `config=`: Helion would "
                          f"autotune in the worker (give one helion.Config){_where(node)}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and dotted(node.func) in kernels:
            for kw in node.keywords:
                if kw.arg not in KERNEL_SETTINGS:
                    what = f"`{kw.arg}=`" if kw.arg else "`**` settings"
                    found.append((Status.FORBIDDEN_CODE, f"gives `{dotted(node.func)}` {what}: only "
                                  f"{', '.join(sorted(KERNEL_SETTINGS))}{_where(node)}"))
    return found


def check_tile_kernels(tree: ast.Module, kernel_defs: set[ast.AST], kernels: tuple[str, ...]) -> list[Finding]:
    """Broken rules of the module's tile kernels (the function definitions in `kernel_defs`)."""
    hl, torch = _aliases(tree)
    found = _settings(tree, kernel_defs, kernels)
    for fn in kernel_defs:
        assert isinstance(fn, ast.FunctionDef)
        for stmt in fn.body:
            found += _host(stmt, hl, torch)
    return found
