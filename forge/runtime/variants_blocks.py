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
    takes minutes) while it is before `finish` (time.monotonic()), then the model itself where `whole_fits`.
    No whole graph is captured, so no rewrites."""
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
        blocks: list[tuple[Measured, float]] = []  # the blocks compiled, with kernels and without: their seconds
        for with_kernels in (True, False) if kernels else (False,):
            if finish is None or time.monotonic() < finish:
                start = time.monotonic()
                m = run(Variant(with_kernels, (), runtime, blocks=True))
                blocks.append((m, time.monotonic() - start))
        if whole_fits(blocks, finish):
            run(Variant(False, (), runtime))
    if not tried:
        tried.append(_nothing())
    return min(tried, key=time_of), tried  # all failed: the first, with its error


def whole_fits(blocks: list[tuple[Measured, float]], finish: float | None) -> bool:
    """Whether the model itself is compiled too (torch.compile's result), given the block-wise compilations
    measured (`blocks`: each with its seconds). Always where no time is set or none of them worked: it is then
    the floor. Else only where it is expected to end before `finish`, at the last that worked's seconds times
    the number of blocks: Dynamo and Inductor go through every block of the whole model, not each kind once
    (Qwen 3.5 on an H100 at 3837e03, 24 blocks of 3 kinds: the blocks compiled and timed in 12.2 s, the
    whole model in 292.0 s, 24 times that; it ran then, judged at 8 times, and lost to the blocks compiled
    with forge's kernels, 37.7 ms against 31.3)."""
    worked = [(m, seconds) for m, seconds in blocks if m.ok]
    if finish is None or not worked:
        return True
    m, seconds = worked[-1]
    return time.monotonic() + seconds * m.sites.get("blocks", 1) <= finish


def _nothing() -> Measured:
    """What choose_blockwise returns when it measured nothing (no kernels, no compilation)."""
    return Measured(TRIVIAL, 0.0, 0.0, False, float("inf"), None, {}, "no variant to measure")
