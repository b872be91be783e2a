"""End to end: the optimized model against eager, timed interleaved in one process, outputs compared.

Timing: warm-up, then eager and optimized forwards alternate (CUDA: call by call, events and a
device-wide synchronisation; CPU: perf_counter, in alternating blocks of BLOCK calls whose first call is
not counted), medians of each. Blocks on the CPU because code compiled by Inductor runs on an OpenMP pool
of its own beside ATen's, and a pool that has just worked keeps its threads spinning: call by call, each
side ran in the other's wake (a compiled RMSNorm measured 0.37 ms in blocks and 0.57 ms call by call,
on 2 cores). Outputs: both run on fresh inputs (a new seed of the model's own input generator) and are
compared with the dtype's tolerance for a model (forge.tolerance.model_tolerance: float16's for a float32
model whose convolutions the user's settings let cuDNN run in TF32), relative to the magnitude of eager's
output. When that fails, eager may be the inaccurate one (an output that is
all rounding noise, such as a GroupNorm over one-element groups): both are then judged against the model
run in float64, and forge matches if it is at most twice as far from it as eager is. Peak device memory: one
forward's over eager's (peak_ratio).
"""

from __future__ import annotations

import copy
import gc
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from forge.bench import time_call_us
from forge.capture.model_input import state_kept
from forge.tolerance import model_tolerance, rel_error, tf32_convolutions


def _time_once(fn: Callable[[], Any], cuda: bool) -> float:
    return time_call_us(fn, cuda) / 1e3  # ms


BLOCK = 4  # CPU: calls of one side in a row (the first of them not counted), see the module docstring


def alternate(fns: list[Callable[[], Any]], device: str, runs: int = 15, warmup: int = 3) -> list[list[float]]:
    """At least `runs` millisecond samples of each callable, taken in turn (see the module docstring)."""
    cuda = device.startswith("cuda")
    timed = 1 if cuda else BLOCK - 1
    samples: list[list[float]] = [[] for _ in fns]
    with torch.no_grad():
        for _ in range(warmup):
            for fn in fns:
                fn()
        while len(samples[0]) < runs:
            for fn, out in zip(fns, samples, strict=True):
                if not cuda:
                    fn()  # in the previous one's wake: not counted
                out.extend(_time_once(fn, cuda) for _ in range(timed))
    return samples


def interleaved_ms(eager: Callable[[], Any], optimized: Callable[[], Any], device: str, runs: int = 15,
                   warmup: int = 3) -> tuple[float, float]:
    """Median milliseconds of eager and optimized forwards, alternating (see the module docstring)."""
    a, b = alternate([eager, optimized], device, runs, warmup)
    return statistics.median(a), statistics.median(b)


def compare(expected: Any, got: Any, tf32: bool = False) -> tuple[bool, float]:
    """(match, max relative error) of two outputs (tensors or tuples of them); `tf32`: convolutions may run in
    TF32 (forge.tolerance.model_tolerance)."""
    exp = expected if isinstance(expected, (tuple, list)) else (expected,)
    out = got if isinstance(got, (tuple, list)) else (got,)
    if len(exp) != len(out):
        return False, float("inf")
    worst, ok = 0.0, True
    for e, o in zip(exp, out, strict=True):
        if not isinstance(e, torch.Tensor):
            ok &= e == o
            continue
        if e.shape != o.shape or e.dtype != o.dtype:
            return False, float("inf")
        if not e.is_floating_point():
            ok &= bool(torch.equal(e, o))
            continue
        err = rel_error(o.double(), e.double())
        worst = max(worst, err)
        ok &= err <= model_tolerance(e.dtype, tf32) and bool((torch.isfinite(o) == torch.isfinite(e)).all())
    return ok, worst


def fresh_inputs(inputs: list[Any]) -> list[Any]:
    """New random values for the floating-point tensors of `inputs` (the others kept), to compare on."""
    return [torch.randn_like(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def outputs_match(model: torch.nn.Module, optimized: Callable[..., Any], inputs: list[Any]) -> tuple[bool, float]:
    """(match, max relative error against eager) of the optimized model on `inputs`; see the module docstring.

    Important: both start from the same buffers and the same random seed, and what they leave in the buffers
    counts as output (a training-mode BatchNorm updates its running statistics: forge's must be the same); the
    buffers are put back as they were after."""
    tf32 = tf32_convolutions(model)
    with torch.no_grad(), state_kept(model):
        before = _buffers(model)
        expected = (*pytree.tree_leaves(_seeded(model, inputs)), *_buffers(model))
        _restore(model, before)
        got = (*pytree.tree_leaves(_seeded(optimized, inputs)), *_buffers(model))
        ok, err = compare(expected, got, tf32)
        if ok:
            return ok, err
        _restore(model, before)
        try:  # the float64 truth, for when eager itself is mostly rounding error
            exact = copy.deepcopy(model).double()
            exact = (*pytree.tree_leaves(_seeded(exact, [_double(x) for x in inputs])), *_buffers(exact))
        except Exception:  # a model that cannot run in float64: eager is the reference
            return ok, err
        _, err_eager = compare(_double(exact), _double(expected), tf32)
        good, err_forge = compare(_double(exact), _double(got), tf32)
    return good or err_forge <= 2 * err_eager, err  # within a factor 2 of eager's own rounding error


_SEED = 1234  # each side's random ops (training-mode dropout) start from it: the same samples where they agree


def _seeded(fn: Callable[..., Any], inputs: list[Any]) -> Any:
    devices = sorted({x.device.index or 0 for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(_SEED)
        return fn(*inputs)


def _buffers(model: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """Copies of the model's buffers, as a forward left them."""
    return tuple(b.detach().clone() for b in model.buffers())


def _restore(model: torch.nn.Module, values: tuple[torch.Tensor, ...]) -> None:
    for b, v in zip(model.buffers(), values, strict=True):
        if not torch.equal(b, v):  # a buffer left as it was keeps its version (forge.runtime.result)
            b.copy_(v)


def _double(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_double(v) for v in x)
    return x


def peak_ratio(fn: Callable[..., Any], model: torch.nn.Module, inputs: list[Any], base: int) -> float | None:
    """Peak device memory (reserved by the caching allocator, so a CUDA graph's private pool counts) of one
    forward of `fn` over eager's alone. `base`: what was reserved before `fn` was built, so eager's own
    peak is the one measured now less what building `fn` added (folded weights, graph pools)."""
    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs):
        return None
    release()
    held = torch.cuda.memory_reserved() - base  # what building fn keeps: graph pools, folded weights
    peaks = []
    with torch.no_grad():
        for f in (model, fn):
            release()  # what is cached but free is not a peak of this forward
            torch.cuda.reset_peak_memory_stats()
            f(*inputs)
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_reserved())
    eager_alone = peaks[0] - held
    return peaks[1] / eager_alone if eager_alone > 0 else None


def release() -> None:
    """Free what is unreferenced and give the allocator's free cache back, after the device is idle."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
