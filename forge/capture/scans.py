"""Loops as tasks: a library's recurrence over chunks captured as one op (a scan), not unrolled.

transformers' gated delta rule (`torch_chunk_gated_delta_rule` of Qwen 3.5, Qwen3-Next, OLMo-hybrid, ...) walks the
sequence in chunks of 64 tokens in a Python loop; torch.export unrolls that loop, so every chunk of every layer
became a few dozen ATen nodes (Qwen 3.5 at 2048 tokens: 32 chunks a layer), regions the cutter turned into
per-chunk tasks no policy could replace as the loop they are. While forge captures (`as_ops`), each library
module's function is called through the custom op `forge_scan::chunk_gated_delta_rule` instead:
- its eager implementation calls the library's function itself, by name (`impl`, the module and attribute the
  model's forward calls), so the captured graph, the task's reference and the dispatcher's fallback run what
  eager runs;
- its fake implementation gives the output's shape, so export keeps it as one node, which the cutter makes a
  task of its own (family "scan"; forge.tasks.ops) with the same key in every layer of the same shapes.

Why wrap the function rather than recognise the per-chunk subgraph in the unrolled graph: the function is a
stable, named boundary (the name FLA's and the hub's kernels are registered under), with documented arguments
and semantics; a recogniser would depend on how export orders and names one iteration's nodes, break on any
change of the loop body, and still pay for the unrolled trace it tries to undo. A call the op does not cover
(packed sequences: `cu_seqlens`; a signature other than the one known) goes to the library as before.

Important: the op's inputs have a domain (`DOMAINS`): the decay `g` is a log (<= 0: the state is multiplied
by exp(g) each step) and `beta` a rate in (0, 1). Outside it the recurrence grows without bound and no two
implementations agree, so verification draws those inputs inside it (forge.evaluate.domains).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import logging
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

log = logging.getLogger(__name__)

NAMESPACE = "forge_scan"
IMPORT = "import forge.capture.scans  # noqa: F401 (registers torch.ops.forge_scan)"
FUNCTIONS = ("torch_chunk_gated_delta_rule",)  # library functions captured as scans, by name
# The op's parameters in order, and the domain of those that have one (see the module doc).
PARAMS = ("query", "key", "value", "g", "beta", "initial_state", "chunk_size", "use_qk_l2norm_in_kernel", "impl")
DOMAINS = {"g": "nonpositive", "beta": "unit"}
PACKED = ("cu_seqlens", "seq_idx")  # keyword arguments of packed sequences, which the op does not cover
_ORIGINAL = "__forge_original__"  # on a routed function: the library's own


LIBRARY = "transformers."  # the package whose modules' functions forge routes (as_ops) and calls back by name


def library_function(impl: str) -> Callable[..., Any]:
    """The library function `impl` ("module.attribute") names, as the model's forward calls it (decorators
    and all), also while forge's routing is in place; ValueError for a name forge never routes."""
    module, _, name = impl.rpartition(".")
    if not module.startswith(LIBRARY) or name not in FUNCTIONS:
        raise ValueError(f"Invalid scan function: {impl!r}")
    fn = getattr(importlib.import_module(module), name)
    return getattr(fn, _ORIGINAL, fn)


def python_function(fn: Any, name: str) -> Callable[..., Any] | None:
    """The plain Python function behind a library's callable `fn` (its decorators' `__wrapped__` followed), or
    None. With the `kernels` package installed, transformers' hub-kernel functions are module instances whose
    class's forward calls the function (kernels' `_create_func_module`): that one, found by its name."""
    if not inspect.isfunction(fn):
        closure = getattr(getattr(type(fn), "forward", None), "__closure__", None) or ()
        fn = next((c.cell_contents for c in closure if inspect.isfunction(c.cell_contents)
                   and c.cell_contents.__name__ == name), None)
    return inspect.unwrap(fn) if fn is not None else None


def library_source(impl: str) -> str:
    """The source of the function `impl` names, without its decorators (what a prompt shows); "" if unknown."""
    try:
        fn = python_function(library_function(impl), impl.rpartition(".")[2])
        return textwrap.dedent(inspect.getsource(fn)) if fn is not None else ""
    except (OSError, TypeError, ImportError, AttributeError) as e:
        log.debug("no source for %s: %s", impl, e)
        return ""


def _fresh(t: torch.Tensor, given: list[torch.Tensor | None]) -> torch.Tensor:
    """`t`, or a copy where it shares memory with an input (a custom op's output may not alias one)."""
    ptr = t.untyped_storage().data_ptr()
    if any(x is not None and x.untyped_storage().data_ptr() == ptr for x in given):
        return t.clone()
    return t


@torch.library.custom_op(f"{NAMESPACE}::chunk_gated_delta_rule", mutates_args=())
def chunk_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, initial_state: torch.Tensor | None, chunk_size: int,
                           use_qk_l2norm_in_kernel: bool, impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over chunks, as the library function `impl` computes it: (the output
    [batch, seq, v_heads, v_dim] in query's dtype, the final state [batch, v_heads, k_dim, v_dim] in float32).
    Under `precise()` with float64 inputs: the rule in float64 (`recurrence`), both outputs float64."""
    if _PRECISE.get() and query.dtype == torch.float64:
        return recurrence(query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel)
    out, state = library_function(impl)(query, key, value, g=g, beta=beta, chunk_size=chunk_size,
                                        initial_state=initial_state, output_final_state=True,
                                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    given = [query, key, value, g, beta, initial_state]
    return _fresh(out, given), _fresh(state, given)


_PRECISE = contextvars.ContextVar("forge_scan_precise", default=False)


@contextmanager
def precise() -> Iterator[None]:
    """Within it, the scan op given float64 inputs computes the rule in float64 (`recurrence`) instead of calling
    the library, which computes in float32 whatever it is given: verification's higher-precision reference of a
    scan (forge.evaluate.verify.Reference), so that a float32 output is judged against the rule, not against
    the library's own float32 rounding (2e-4 to 6e-4 from it on verification's inputs)."""
    token = _PRECISE.set(True)
    try:
        yield
    finally:
        _PRECISE.reset(token)


def recurrence(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               initial_state: torch.Tensor | None, l2norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token in float64, with the library's conventions (grouped heads, q and k
    L2-normalised with eps 1e-6 inside the root, q scaled by k_dim ** -0.5): per token t, S *= exp(g_t);
    u = beta_t (v_t - S^T k_t); S += k_t u^T; o_t = S^T q_t. (output [b, t, hv, dv], final state [b, hv, dk, dv])."""
    q, k, v, g64, b64 = (x.to(torch.float64) for x in (query, key, value, g, beta))
    hk, hv = k.shape[2], v.shape[2]
    if hk != hv:
        q, k = q.repeat_interleave(hv // hk, dim=2), k.repeat_interleave(hv // hk, dim=2)
    if l2norm:
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q * q.shape[-1] ** -0.5
    state = (initial_state.to(torch.float64).clone() if initial_state is not None else
             q.new_zeros(q.shape[0], hv, q.shape[-1], v.shape[-1]))
    out = v.new_empty(v.shape)
    for t in range(q.shape[1]):
        state = state * g64[:, t].exp()[..., None, None]
        u = (v[:, t] - torch.einsum("bhkv,bhk->bhv", state, k[:, t])) * b64[:, t][..., None]
        state = state + k[:, t][..., :, None] * u[..., None, :]
        out[:, t] = torch.einsum("bhkv,bhk->bhv", state, q[:, t])
    return out, state


@chunk_gated_delta_rule.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
      initial_state: torch.Tensor | None, chunk_size: int, use_qk_l2norm_in_kernel: bool,
      impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    b, t, _, dk = key.shape
    hv, dv = value.shape[-2:]
    return query.new_empty((b, t, hv, dv)), query.new_empty((b, hv, dk, dv), dtype=torch.float32)


def _routed(original: Callable[..., Any], function: Callable[..., Any], impl: str) -> Callable[..., Any]:
    """`original` (the library's callable, `function` its Python function) called through the scan op where the
    op covers the call, else as it is."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def routed(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        packed = any(a.pop("kwargs", {}).get(k) is not None for k in PACKED)  # other extras are not read
        tensors = [a.get(n) for n in PARAMS[:5]]
        if packed or not all(isinstance(x, torch.Tensor) for x in tensors) or set(a) != {
                *PARAMS[:-1], "output_final_state"}:
            return original(*args, **kwargs)  # packed sequences or another signature: the library's own
        out, state = chunk_gated_delta_rule(*tensors, a["initial_state"], int(a["chunk_size"]),
                                            bool(a["use_qk_l2norm_in_kernel"]), impl)
        return out, state if a["output_final_state"] else None

    setattr(routed, _ORIGINAL, original)
    return routed


@contextmanager
def as_ops() -> Iterator[None]:
    """While inside, every imported transformers module's gated delta rule (FUNCTIONS) is called through the scan
    op (module doc); the library's functions are put back after."""
    patched: list[tuple[Any, str, Any]] = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(LIBRARY):
            continue
        for attr in FUNCTIONS:
            fn = vars(module).get(attr)
            function = python_function(fn, attr) if callable(fn) and not hasattr(fn, _ORIGINAL) else None
            if function is not None:
                setattr(module, attr, _routed(fn, function, f"{name}.{attr}"))
                patched.append((module, attr, fn))
    try:
        yield
    finally:
        for module, attr, fn in patched:
            setattr(module, attr, fn)


_IMPL = re.compile(rf"torch\.ops\.{NAMESPACE}\.\w+\.default\(.*'([\w.]+)'\)")


def libraries(source: str) -> tuple[str, ...]:
    """The library modules a task's source calls scans of (what a sandboxed worker imports before it confines
    itself: importing them later needs system calls its filter kills, forge.evaluate.parent)."""
    return tuple(sorted({m.group(1).rpartition(".")[0] for m in _IMPL.finditer(source)
                         if m.group(1).startswith(LIBRARY)}))


def calls_scan(source: str) -> bool:
    """True for a task's source that calls a scan op (its reference runs the library's function through forge)."""
    return f"torch.ops.{NAMESPACE}." in source


def is_scan(target: Any) -> bool:
    """True for a call of a scan op (an OpOverload of NAMESPACE)."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace == NAMESPACE
