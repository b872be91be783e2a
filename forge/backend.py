"""`torch.compile(model, backend="forge", options={...})`: forge as a TorchDynamo backend.

Dynamo hands a backend each graph it captured (an FX GraphModule, not the user's module) with its example
inputs; torch.compile's `options` reach it as `backend(gm, example_inputs, options={...})`. The backend is
registered by name through the `torch_dynamo_backends` entry point in pyproject.toml, which Dynamo reads
(torch/_dynamo/backends/registry.py); from a source tree that is not pip-installed, `forge.backend.register()`
registers it by hand.

Options (all optional):
- `artifact`: a run's artifact folder (`forge optimize`'s runs/<id>/): its kernels are applied to the graph
  wherever the graph has the task they were made for (task keys are structural hashes of regions, so a graph
  of the same model matches); the others are not used, counted and logged;
- without `artifact`, a search on the graph, as `forge.optimize` runs one: `seconds` (default 60), `budget`
  (candidates, default 32), `policy` (default "recipes"), `db` and `runs_dir` (forge.optimize's defaults).

Important: nothing is searched or loaded while Dynamo compiles (a search there re-enters Dynamo): the backend
returns a `LazyGraph`, which does it on its first call that needs no gradient, on that call's real inputs
(the example inputs may be fake tensors), then dispatches to forge's result. A user error there (an artifact
that is missing, malformed or was changed since it was saved, an unknown policy: forge.errors.UserError)
raises from that call; any other failure runs the graph itself from then on, with a warning. forge is for
inference: a call with gradients enabled and an input requiring one (Dynamo passes the model's parameters as
inputs, so any call with grad mode on in practice) runs the graph as it is. Each graph Dynamo makes (one per
graph break or recompilation) is searched or loaded on its own: `fullgraph=True` gives one.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from forge.errors import UserError
from forge.runtime.result import ForgeModel

log = logging.getLogger(__name__)

NAME = "forge"
DEFAULTS: dict[str, Any] = {"artifact": None, "seconds": 60.0, "budget": 32, "policy": "recipes", "db": None,
                            "runs_dir": None}


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """The Dynamo backend (module docstring): a callable computing what `gm` does, with forge's kernels.

    Args:
        gm: the graph Dynamo captured.
        example_inputs: its example inputs (real or fake; not used: the first real call's are).
        **kwargs: `options` (a dict, see the module docstring) and `mode` from torch.compile; `mode` is ignored.
    Returns:
        a LazyGraph, called as `gm` is.
    Example:
        >>> fast = torch.compile(model, backend="forge", options={"artifact": "runs/ab12cd"})
    """
    options = parse_options(kwargs.get("options"))
    return LazyGraph(gm, options)


def parse_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The backend's options with defaults; ValueError on an unknown one (a typo would silently search)."""
    unknown = sorted(set(options or {}) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"Invalid forge backend option(s) {unknown}: expected some of {sorted(DEFAULTS)}")
    return {**DEFAULTS, **(options or {})}


def register() -> None:
    """Register the backend as "forge" with Dynamo, for a source tree whose entry point is not installed."""
    from torch._dynamo.backends.registry import list_backends, register_backend

    if NAME not in list_backends(exclude_tags=()):
        register_backend(backend, name=NAME)


def graphs() -> list[LazyGraph]:
    """The backend's live results, oldest first (one per graph Dynamo compiled): for their `counters()`."""
    return [g for g in (r() for r in _MADE) if g is not None]


class DynamoGraph(torch.nn.Module):
    """Dynamo's graph as a model (the run's name in the store): the parameters Dynamo passes as inputs held as
    parameters again, so that forge captures the same graph (and task keys) as for the user's module and may
    fold or merge weights."""

    def __init__(self, gm: torch.fx.GraphModule, args: tuple[Any, ...]) -> None:
        super().__init__()
        self.graph = gm
        self.slots = [i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter)]
        self._held = frozenset(self.slots)  # looked up on every call: a set, made once
        self.n = len(args)
        for j, i in enumerate(self.slots):
            self.register_parameter(f"p{j}", args[i])  # the user's Parameter itself, not a copy
        self.train(gm.training)

    def held(self) -> list[torch.nn.Parameter]:
        return list(self._parameters.values())  # p0, p1, ... in registration order

    def split(self, args: tuple[Any, ...]) -> list[Any] | None:
        """The graph's inputs other than the held parameters; None when another tensor is passed for one."""
        if len(args) != self.n or any(args[i] is not p for i, p in zip(self.slots, self.held(), strict=True)):
            return None
        return [a for i, a in enumerate(args) if i not in self._held]

    def forward(self, *inputs: Any) -> Any:
        args, rest, params = [], iter(inputs), iter(self.held())
        for i in range(self.n):
            args.append(next(params) if i in self._held else next(rest))
        return self.graph(*args)


class LazyGraph:
    """What the backend returns: `gm` until forge's result is built on the first call needing no gradient."""

    def __init__(self, gm: torch.fx.GraphModule, options: dict[str, Any]) -> None:
        self.gm, self.options = gm, options
        self.lifted: DynamoGraph | None = None
        self.fn: Callable[..., Any] | None = None
        self.failed = False
        self.calls, self.fallbacks = 0, Counter[str]()
        self.kernels: dict[str, int] = {}  # "used" / "not used": the artifact's kernels on this graph
        _MADE[:] = [r for r in _MADE if r() is not None] + [weakref.ref(self)]

    def __call__(self, *args: Any) -> Any:
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return self._eager("gradient needed", args)
        if self.fn is None and not self.failed:
            self._build(args)
        if self.fn is None or self.lifted is None:
            return self._eager("forge failed", args)
        inputs = self.lifted.split(args)
        if inputs is None:
            return self._eager("parameters replaced", args)
        try:
            out = self.fn(*inputs)
        except Exception as e:  # the user's forward must not raise because of forge
            log.warning("forge backend: forge's result failed (%s: %s): running the graph itself from now on",
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            self.fn, self.failed = None, True
            return self._eager("forge failed", args)
        self.calls += 1
        return out

    def _eager(self, why: str, args: tuple[Any, ...]) -> Any:
        self.fallbacks[why] += 1
        return self.gm(*args)

    def _build(self, args: tuple[Any, ...]) -> None:
        """Load the artifact's kernels or search, on these real inputs; a failure is logged and leaves `gm`."""
        try:
            lifted = DynamoGraph(self.gm, args)
            inputs = lifted.split(args) or []
            with torch.no_grad():
                self.fn = self._load(lifted, inputs) if self.options["artifact"] else self._search(lifted, inputs)
            self.lifted = lifted
        except UserError:  # the user's own mistake or a refused artifact (tampered, missing): said, not hidden
            self.failed = True
            raise
        except Exception as e:  # any other failure: the graph runs as it is
            log.warning("forge backend: could not %s (%s: %s): running the graph itself",
                        "load the artifact" if self.options["artifact"] else "search", type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")
            self.fn, self.failed = None, True

    def _load(self, lifted: DynamoGraph, inputs: list[Any]) -> Callable[..., Any]:
        import forge
        from forge.runtime.artifact import read

        path = self.options["artifact"]
        fn = forge.load(path, lifted, inputs)
        keys = {k.key for k in read(path)}
        used = keys & set(fn.counters()) if isinstance(fn, ForgeModel) else set()
        self.kernels = {"used": len(used), "not used": len(keys - used)}
        log.info("forge backend: %d of %d kernels of %s used on this graph (%d not in it)", len(used), len(keys),
                 path, len(keys - used))
        return fn

    def _search(self, lifted: DynamoGraph, inputs: list[Any]) -> Callable[..., Any]:
        import forge

        o = self.options
        fn, report = forge.optimize(lifted, inputs, seconds=float(o["seconds"]), budget=int(o["budget"]),
                                    policy=o["policy"], db=o["db"], runs_dir=o["runs_dir"])
        log.info("forge backend: searched this graph: run %s, %.2fx end to end%s, artifact %s", report.run_id,
                 report.speedup, "" if report.applied else " (eager kept)", report.artifact)
        return fn

    def counters(self) -> dict[str, Any]:
        """forge's result's counters (forge.runtime.result.ForgeModel.counters) and, under "graph", the calls
        that ran it and those that ran the graph itself, by reason."""
        inner = self.fn.counters() if isinstance(self.fn, ForgeModel) else {}
        return {**inner, "graph": {"hits": self.calls, "fallbacks": dict(self.fallbacks)}}


_MADE: list[weakref.ref[LazyGraph]] = []
