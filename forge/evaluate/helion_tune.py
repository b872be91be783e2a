"""Helion's autotuner on a loaded candidate, in the worker (issue 18 item 2): the worker's side of the Tune step.

A Helion candidate names one config per kernel (docs/kernel-abi.md), so that the worker never autotunes while
it is judged. Asked to (forge.evaluate.autotune, from the search's end of a task), the worker that judges
Python candidates runs Helion's own autotuner on each kernel the candidate's launcher calls, with the
arguments that launcher passes, for the effort and seconds asked. The kernel's own config (the one it was
judged with) seeds the search: Helion puts a seed into its first population (a bad one is logged and left
out), and times it again among its finalists when the budget has time left for that; so a short search has the
config forge found among those it can answer with, not only Helion's default and cached configs (quick effort)
or random ones (full). What comes back is data: each kernel's name and the config the autotuner chose, which the
judge writes into a new candidate that is judged as any other. Nothing here decides a verdict.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)


def _kernels(module: types.ModuleType) -> dict[str, Any]:
    import helion

    return {name: k for name, k in vars(module).items() if isinstance(k, helion.Kernel)}


def recorded_calls(module: types.ModuleType, launch: Callable[..., Any], inputs: Sequence[torch.Tensor],
                   outputs: Sequence[torch.Tensor]) -> list[tuple[str, Any, tuple[Any, ...]]]:
    """(name, kernel, args) of each Helion kernel the launcher calls, in order, recorded without running them:
    each kernel's name in the module is bound to a recorder while `launch` runs (its body looks it up there)."""
    kernels = _kernels(module)
    calls: list[tuple[str, Any, tuple[Any, ...]]] = []

    def recorder(name: str) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            calls.append((name, kernels[name], tuple(kernels[name].normalize_args(*args, **kwargs))))
        return record

    try:
        for name in kernels:
            setattr(module, name, recorder(name))
        launch(list(inputs), list(outputs))
    finally:
        for name, k in kernels.items():
            setattr(module, name, k)
    return calls


def settle(kernel: Any, effort: str, budget_s: int) -> None:
    """Helion's settings for one search on `kernel`: the effort, the seconds, no progress bar, and the kernel's
    own configs (its `config=`) as the search's seeds (`autotune_seed_configs`)."""
    kernel.settings.autotune_effort = effort
    kernel.settings.autotune_budget_seconds = budget_s
    kernel.settings.autotune_progress_bar = False
    kernel.settings.autotune_seed_configs = list(kernel.configs) or None


def autotune(module: types.ModuleType, launch: Callable[..., Any], inputs: Sequence[torch.Tensor],
             outputs: Sequence[torch.Tensor], effort: str, budget_s: int) -> str:
    """JSON: [[kernel name, config], ...], one per kernel called (the first call's arguments of each). Helion's
    default search (LFBO) needs scikit-learn; without it, its pattern search."""
    if importlib.util.find_spec("sklearn") is None:
        os.environ.setdefault("HELION_AUTOTUNER", "PatternSearch")
    found: dict[str, dict[str, Any]] = {}
    for name, kernel, args in recorded_calls(module, launch, inputs, outputs):
        if name in found:
            continue
        settle(kernel, effort, budget_s)
        config = kernel.autotune(args, force=True)
        found[name] = dict(config.config)
        log.info("helion autotuned %s (%s): %s", name, os.environ.get("HELION_AUTOTUNER", "its default"), config)
    return json.dumps([[n, c] for n, c in found.items()])
