"""What forge hands a user: the chosen variant of a model, called only where it computes what the model would.

`ForgeModel` wraps the callable a variant is built into (forge.runtime.variants.build), with the model's own
forward as its fallback, taken (and counted in `counters()["model"]`) when:
- a gradient is needed (grad mode on and an input or a parameter requiring one): forge's kernels, graphs and
  rewrites are inference only, so the model runs as it is and `backward` works ("gradient needed");
- a parameter, buffer or submodule of the model was replaced (`model.fc.weight = Parameter(...)`) after the
  result was built, and the variant cannot read the new one: a patched graph run from Python (`graph`,
  `cuda-graph`, no rewrites, captured row-major) reads the new tensors (its CUDA graph is captured again);
  any other variant runs eager from then on ("parameters replaced");
- the variant holds values derived from the parameters (BatchNorm folded into convolutions, merged linears,
  channels-last copies of weights) and a parameter changed in place since (`load_state_dict`, an optimiser
  step): those values are stale, so eager from then on ("parameters changed"). Without derived values a
  change in place is simply read: the graph holds the parameters themselves.
- the model was put in another mode (`model.eval()`, `model.train()`) than the one it was captured in: the graph
  is that mode's function (a BatchNorm on running or on batch statistics), so eager while it differs ("mode
  changed"; the model's own flag is checked, not its submodules').
Once eager for a replaced or changed parameter, always eager: `forge.load` again builds a result on the new ones.
In training mode the forward itself updates buffers (BatchNorm's running statistics): they are the model's state,
no value is derived from them, and their changes do not count as changed parameters.
Calls with other shapes than the captured ones are counted there too ("inputs differ"), and block calls that
ran their own forward ("block ran eager"). Replacements are seen through torch's global registration hooks
(a dictionary lookup when any module registers anything); in-place changes through the tensors' version
counters, compared on each call only for variants with derived values.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as _module

from forge.runtime.blockwise import BlockwiseModule
from forge.runtime.dispatch import Counters, GuardedForward, OptimizedModule

log = logging.getLogger(__name__)

_grad_enabled = torch.is_grad_enabled


class ForgeModel(torch.nn.Module):
    """A model's forge result (module docstring). `model` is the user's module (not a submodule of this one:
    `parameters()` and `state_dict()` of the result are empty; the model's are the model's)."""

    def __init__(self, fn: Callable[..., Any], model: torch.nn.Module, patched: GuardedForward | None,
                 reread: Callable[[], bool] | None, derived: bool) -> None:
        super().__init__()
        d = self.__dict__  # plain attributes: none is a submodule of the result
        d["fn"], d["model"], d["patched"], d["_reread"] = fn, model, patched, reread
        self._params = [p for p in model.parameters()]
        state = _updated(patched)  # buffers the forward updates itself: state, nothing is derived from them
        tensors = [*self._params, *(b for b in model.buffers() if id(b) not in state)]
        self._versions = [(t, t._version) for t in tensors] if derived else []
        self._replaced = self._dead = False
        self._training = model.training  # the mode captured in
        self.calls, self.fallbacks = 0, Counter[str]()
        _watch(self, model)

    @classmethod
    def patched_graph(cls, opt: OptimizedModule) -> ForgeModel:
        """The result of a patched graph without rewrites (forge.apply, an artifact from before variants): it
        reads replaced parameters where it holds the model's own, and holds derived values where it does not."""
        return cls(opt, opt.original, opt, opt.reread, derived=opt._state is None)

    def forward(self, *inputs: Any) -> Any:
        if _grad_enabled() and (any(p.requires_grad for p in self._params) or
                                any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)):
            if not self.fallbacks["gradient needed"]:
                log.warning("forge: %s called with gradients enabled: forge's kernels are for inference, so the "
                            "model runs eagerly (call it under torch.no_grad() or torch.inference_mode())",
                            type(self.model).__name__)
            return self._eager("gradient needed", inputs)
        if self._replaced:
            self._replacement()
        if self._dead:
            return self._eager("parameters replaced", inputs)
        for t, v in self._versions:
            if t._version != v:
                self._versions, self._dead = [], True
                log.warning("forge: a parameter of %s changed in place after forge built its result, whose "
                            "values derived from it are stale: running the model eagerly (load it again)",
                            type(self.model).__name__)
                return self._eager("parameters changed", inputs)
        if self.model.training is not self._training:
            if not self.fallbacks["mode changed"]:
                now, built = ("training", "eval") if self.model.training else ("eval", "training")
                log.warning("forge: %s is in %s mode, forge's result was built in %s mode: running the model "
                            "eagerly", type(self.model).__name__, now, built)
            return self._eager("mode changed", inputs)
        self.calls += 1
        return self.fn(*inputs)

    def _eager(self, why: str, inputs: tuple[Any, ...]) -> Any:
        self.fallbacks[why] += 1
        return self.model(*inputs)

    def _replacement(self) -> None:
        """After a registration in the model: read the new tensors where the variant can, else run eager."""
        self._replaced = False
        self._params = list(self.model.parameters())
        if self._dead:
            return
        if self._reread is not None and self._reread():
            return
        self._dead = True
        log.warning("forge: a parameter, buffer or submodule of %s was replaced after forge built its result, "
                    "which cannot read it: running the model eagerly (load it again)", type(self.model).__name__)

    def counters(self) -> dict[str, Counters]:
        """Per task key: each kernel's hits and fallbacks (by reason); under "model": the forwards that ran
        forge's result and those that ran the model itself, by reason (module docstring)."""
        out = dict(self.patched.counters()) if isinstance(self.patched, (OptimizedModule, BlockwiseModule)) else {}
        whole = Counters(self.calls, Counter(self.fallbacks))
        if isinstance(self.patched, GuardedForward) and self.patched.model_fallbacks:
            whole.fallbacks["inputs differ"] += self.patched.model_fallbacks
            whole.hits -= self.patched.model_fallbacks
        if isinstance(self.patched, BlockwiseModule) and self.patched.block_fallbacks:
            whole.fallbacks["block ran eager"] += self.patched.block_fallbacks
        out["model"] = whole
        return out


def _updated(patched: GuardedForward | None) -> set[int]:
    """Ids of the buffers the patched forward writes back (forge.capture.export.Capture.state_updates)."""
    if not isinstance(patched, OptimizedModule):
        return set()
    return {id(patched._template[slot]) for _, slot in patched._updates}


# id(module) -> (the module, the results built on a model holding it), for the registration hooks
_WATCHED: dict[int, tuple[weakref.ref[torch.nn.Module], weakref.WeakSet[ForgeModel]]] = {}


def _watch(result: ForgeModel, model: torch.nn.Module) -> None:
    _hooks()
    for m in model.modules():
        ref, results = _WATCHED.get(id(m), (None, None))
        if ref is None or ref() is not m or results is None:
            results = weakref.WeakSet()
            _WATCHED[id(m)] = (weakref.ref(m), results)
        results.add(result)


def _registered(module: torch.nn.Module, name: str, value: Any) -> None:
    entry = _WATCHED.get(id(module))
    if entry is not None and entry[0]() is module and getattr(module, name, None) is not value:
        for result in entry[1]:
            result._replaced = True
            if isinstance(value, torch.nn.Module):
                _watch(result, value)
    return None


_HOOKED: list[Any] = []


def _hooks() -> None:
    if not _HOOKED:
        _HOOKED.extend([_module.register_module_parameter_registration_hook(_registered),
                        _module.register_module_buffer_registration_hook(_registered),
                        _module.register_module_module_registration_hook(_registered)])
