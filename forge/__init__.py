"""forge: make PyTorch models faster by searching for better kernels.

Public API (imports are lazy, so `import forge` stays light):
- `forge.optimize(model, example_inputs, seconds=300, ...)`: the main job (`forge optimize`) on a model in hand;
  returns (the model you get, the report): forge's result rebuilt from the run's artifact, or `model` itself
  where nothing forge measured was faster;
- `forge.apply(model, inputs, kernels, strict=False)`: the model with guarded kernels (forge.runtime.dispatch),
  called only where it computes what the model would (forge.runtime.result);
- `forge.load(path, model, inputs, strict=False, verify=False)`: the same from a run's artifact folder
  (forge.runtime.artifact); kernels tuned on another device model are used only with `verify=True`, after they
  pass verification and beat eager here.
"""

from typing import Any

__all__ = ["apply", "load", "optimize"]

_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def optimize(model: Any, example_inputs: list[Any], *, seconds: float = 300.0, budget: int = 400,
             policy: str = "recipes", db: Any = None, runs_dir: Any = None, eval: bool = False) -> tuple[Any, Any]:
    """Search kernels for `model` on `example_inputs` and measure it end to end, as `forge optimize` does: every
    candidate is stored in `db` (default $FORGE_DB, else runs/forge.db) and the artifact written to
    `runs_dir`/<run id>/ (default $FORGE_OUT, else the SQLite store's folder, e.g. runs/; `report.artifact` is its
    absolute path). The device is the inputs'. The model is optimized in the mode it is in (a new nn.Module's is
    training: BatchNorm on the batch's statistics), and its buffers are left as they were; `eval=True` puts it in
    inference mode first (`forge optimize --eval`). The report's `mode` says which. Returns (the optimized
    module, or `model` where forge kept eager; the OptimizeReport)."""
    import torch

    from forge.capture.model_input import LoadedModel, check_device
    from forge.job import optimize as _optimize
    from forge.search.driver import Budget
    from forge.store import Store

    inputs = list(example_inputs)
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    device = str(tensors[0].device) if tensors else "cpu"
    check_device(device)
    first = next((q for q in model.parameters() if q.is_floating_point()), None)
    dtype = _DTYPES.get(str(first.dtype) if first is not None else "torch.float32", "fp32")
    if eval:
        model.eval()
    loaded = LoadedModel(type(model).__name__, model, inputs, device, dtype)
    report = _optimize(loaded, Store(db), policy=policy, runs_dir=runs_dir,
                       budget=Budget(candidates=budget, seconds=seconds, per_task=max(4, min(budget, 16))))
    return (load(report.artifact, model, inputs) if report.applied else model), report


def apply(model: Any, inputs: list[Any], kernels: list[Any], strict: bool = False) -> Any:
    """Capture `model` on `inputs` and swap in the kernels (see forge.runtime.dispatch.apply), as forge's
    result (forge.runtime.result.ForgeModel: the model itself where a gradient is needed, counted)."""
    from forge.runtime.dispatch import apply as _apply
    from forge.runtime.result import ForgeModel

    opt = _apply(model, inputs, kernels, strict=strict)
    return ForgeModel.patched_graph(opt)


def load(path: Any, model: Any, inputs: list[Any], strict: bool = False, verify: bool = False) -> Any:
    """Apply the kernels of a run's artifact folder to `model` (see forge.runtime.artifact.load)."""
    from forge.runtime.artifact import load as _load

    return _load(path, model, inputs, strict=strict, verify=verify)
