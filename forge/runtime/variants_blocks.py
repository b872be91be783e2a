"""Variants of a model whose kernels were found block-wise (forge.capture.blocks): `choose_blockwise`."""

from __future__ import annotations

import time
from typing import Any

import torch

from forge.kernel import KernelArtifact
from forge.runtime.variants import TRIVIAL, Measured, Variant, first_step, measure, time_of


def choose_blockwise(model: torch.nn.Module, inputs: list[Any], kernels: list[KernelArtifact], device: str, *,
                     compile: bool = True, finish: float | None = None) -> tuple[Measured, list[Measured]]:
    """`choose` for kernels found block-wise (forge.capture.blocks): the kernels dispatched block by block on
    the faster runtime (`first_step`); then compiled by Inductor on the runtime that choice implies: each kind
    of block with its kernels and without (once a kind, forge.runtime.blockwise: seconds where the whole model
    takes minutes) while it is before `finish` (time.monotonic()), then the model itself (torch.compile's
    result, the floor: always). No whole graph is captured, so no rewrites."""
    cuda = device.startswith("cuda")
    tried: list[Measured] = []

    def run(v: Variant, need: str = "") -> Measured:
        m, _ = measure(model, inputs, kernels, v, device, None, need)
        tried.append(m)
        return m

    runtime = "inductor-cuda-graph" if cuda else "inductor"
    if kernels:
        _, runtime = first_step(run, True, cuda, blocks=True)
    if compile:
        for with_kernels in (True, False) if kernels else (False,):
            if finish is None or time.monotonic() < finish:
                run(Variant(with_kernels, (), runtime, blocks=True))
        run(Variant(False, (), runtime))
    if not tried:
        tried.append(_nothing())
    return min(tried, key=time_of), tried  # all failed: the first, with its error


def _nothing() -> Measured:
    """What choose_blockwise returns when it measured nothing (no kernels, no compilation)."""
    return Measured(TRIVIAL, 0.0, 0.0, False, float("inf"), None, {}, "no variant to measure")
