"""forge: make PyTorch models faster by searching for better kernels.

Public API (imports are lazy, so `import forge` stays light):
- `forge.apply(model, inputs, kernels, strict=False)`: the model with guarded kernels (forge.runtime.dispatch);
- `forge.load(path, model, inputs, strict=False, verify=False)`: the same from a run's artifact folder
  (forge.runtime.artifact); kernels tuned on another device model are used only with `verify=True`, after they
  pass verification and beat eager here.
"""

from typing import Any

__all__ = ["apply", "load"]


def apply(model: Any, inputs: list[Any], kernels: list[Any], strict: bool = False) -> Any:
    """Capture `model` on `inputs` and swap in the kernels (see forge.runtime.dispatch.apply)."""
    from forge.runtime.dispatch import apply as _apply

    return _apply(model, inputs, kernels, strict=strict)


def load(path: Any, model: Any, inputs: list[Any], strict: bool = False, verify: bool = False) -> Any:
    """Apply the kernels of a run's artifact folder to `model` (see forge.runtime.artifact.load)."""
    from forge.runtime.artifact import load as _load

    return _load(path, model, inputs, strict=strict, verify=verify)
