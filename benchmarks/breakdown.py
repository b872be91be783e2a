"""Where a forward's device time goes: the torch profiler's kernel times, by family and by kernel.

`breakdown(fn, runs)` profiles `runs` calls of `fn` (after one warm call) on the CUDA device and returns
{"ms": device ms a call, "families": {family: ms a call}, "top": [[kernel, ms a call, calls a call], ...]}.
Kernels inside a CUDA graph replay are counted too (CUPTI traces graph nodes). The family of a kernel is
the first rule of FAMILIES its name matches (lower-cased), else "other". Used by models.py --profile to say
what a gap to torch.compile is made of.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("forge", ("forge_",)),
    ("gemm", ("triton_tem",)),  # Inductor's GEMM templates, before its other Triton kernels
    # Inductor's fused kernels before the vendor families: "triton_red_fused_convolution_native_group_norm_silu"
    # is a GroupNorm with a convolution's bias add in it, not a convolution (it was counted as one until
    # 2026-12-01: the SD3.5 VAE's "convolution 24.9 ms" held about 8 ms of such GroupNorms)
    ("triton", ("triton_",)),
    ("attention", ("flash", "fmha", "attention", "sdpa", "flash_fwd")),
    ("convolution", ("conv", "cudnn", "implicit_convolve", "wgrad", "dgrad", "fprop")),
    ("gemm", ("gemm", "cutlass", "xmma", "cublas", "nvjet", "sm90_", "matmul", "mm_")),
    ("copy", ("copy", "memcpy", "memset", "cat", "transpose", "layout")),
    ("reduction", ("reduce", "norm", "softmax", "welford")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "pointwise")),
)


def family(kernel: str) -> str:
    """The family of a kernel name (FAMILIES' first match)."""
    low = kernel.lower()
    return next((fam for fam, keys in FAMILIES if any(k in low for k in keys)), "other")


def breakdown(fn: Callable[[], Any], runs: int = 10, top: int = 15) -> dict[str, Any]:
    """Device time a call of fn, by family and the top kernels (see the module doc)."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                fn()
            torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            kernels[e.name][0] += e.time_range.elapsed_us() / 1000 / runs  # us -> ms a call
            kernels[e.name][1] += 1 / runs
    fams: dict[str, float] = defaultdict(float)
    for name, (ms, _) in kernels.items():
        fams[family(name)] += ms
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    return {"ms": sum(ms for ms, _ in kernels.values()),
            "families": dict(sorted(fams.items(), key=lambda kv: -kv[1])),
            "top": [[name[:120], ms, calls] for name, (ms, calls) in ranked]}
