"""Dispatch overhead: a guarded kernel call against the bare launch of the same kernel on the same tensors.

The kernel is a small pointwise one (x * sigmoid(x) * 2 over a float32 [rows, 64] tensor; on CPU the
recipe policy's C code, on CUDA a hand-written kernel), built once. Three ways to call it:
- bare: the ctypes call into the .so with ForgeTensor arrays built beforehand (nothing else per call);
- guarded: `GuardedKernel.forward(x)`, what a patched model runs: guards (autograd, device, dtype, shape,
  stride), a fresh output tensor, the launch, the hit counter;
- eager: the task's PyTorch reference, for scale.
Each is timed in batches of `--calls` calls (perf_counter_ns; CUDA: synchronised after each batch), the
three interleaved batch by batch, and the median per call over `--batches` batches is reported. The
overhead is guarded minus bare; the goal is at most 3 us. The CPU kernel runs on one OpenMP thread unless
OMP_NUM_THREADS says otherwise (see below).

    python benchmarks/dispatch_overhead.py                  # CPU
    python benchmarks/dispatch_overhead.py --device cuda    # on a GPU machine (nvcc needed)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# One OpenMP thread unless set: with several, waking the kernel's threads costs tens of microseconds that
# vary with the machine's load and are the same with or without the dispatcher. Set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.evaluate.build import build  # noqa: E402
from forge.evaluate.launch import Launcher  # noqa: E402
from forge.kernel import Candidate, KernelArtifact, TaskSpec  # noqa: E402
from forge.runtime.dispatch import GuardedKernel  # noqa: E402
from forge.tasks.cut import Task, build_tasks  # noqa: E402

CUDA_SOURCE = r"""
#include "forge_abi.h"
__global__ void swish2(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = 2.0f * v / (1.0f + __expf(-v)); }
}
extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
    long n = 1;
    for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
    swish2<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((const float*)in[0].data, (float*)out[0].data, n);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""


class Swish2(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x) * 2.0


def the_task(rows: int) -> Task:
    """The model's one task, captured on the CPU (its key and reference do not depend on the device)."""
    from forge.capture.export import capture

    x = torch.randn(rows, 64)
    (task,) = build_tasks(capture(Swish2(), [x]).graph_module.graph)
    return task


def kernel(task: Task, device: str) -> KernelArtifact:
    """The built kernel for the task on the device."""
    if device == "cpu":
        from forge.policy.recipes import pointwise

        cand = pointwise.candidate(pointwise.lower(TaskSpec.of(task)), pointwise.Knobs())
        arch = None
    else:
        from forge.evaluate.evaluator import device_arch

        cand, arch = Candidate("cuda", CUDA_SOURCE), device_arch(device)
    built = build(cand, arch)
    if not built.ok:
        raise SystemExit(f"build failed:\n{built.log}")
    backend = "cpu" if device == "cpu" else "cuda"
    return KernelArtifact(task.key, backend, built.path, cand.entry, task.inputs, task.outputs, task.source)


def per_call_us(fns: list[Callable[[], object]], calls: int, batches: int, cuda: bool) -> list[float]:
    """Median microseconds per call of each function, timed in interleaved batches."""
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(batches):
        for s, fn in zip(samples, fns, strict=True):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            if cuda:
                torch.cuda.synchronize()
            s.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return [statistics.median(s) for s in samples]


def measure(rows: int, device: str, calls: int, batches: int) -> tuple[int, float, float, float]:
    """(elements, bare us, guarded us, eager us) for one size."""
    task = the_task(rows)
    art = kernel(task, device)
    x = torch.randn(rows, 64, device=device)
    out = torch.empty(task.outputs[0].shape, dtype=task.outputs[0].torch_dtype, device=device)
    bare = Launcher(art.backend, art.path, art.entry).bind([x], [out])
    guarded = GuardedKernel(art, strict=True)
    eager = guarded.reference
    with torch.no_grad():
        torch.testing.assert_close(guarded(x)[0], eager(x)[0])
        bare()
        torch.testing.assert_close(out, eager(x)[0])
        for fn in (bare, lambda: guarded(x), lambda: eager(x)):  # warm-up
            for _ in range(calls):
                fn()
        b, g, e = per_call_us([bare, lambda: guarded(x), lambda: eager(x)], calls, batches, device != "cpu")
    return rows * 64, b, g, e


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64, 1024], help="tensor rows (64 columns each)")
    p.add_argument("--calls", type=int, default=2000, help="calls per timed batch")
    p.add_argument("--batches", type=int, default=15, help="timed batches (the median is reported)")
    args = p.parse_args()
    print(f"dispatch overhead on {args.device} (torch {torch.__version__}, OMP_NUM_THREADS="
          f"{os.environ['OMP_NUM_THREADS']}), median of {args.batches} batches of {args.calls} calls")
    print("| elements | bare launch us | guarded call us | overhead us | eager reference us |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for rows in args.rows:
        n, b, g, e = measure(rows, args.device, args.calls, args.batches)
        worst = max(worst, g - b)
        print(f"| {n} | {b:.2f} | {g:.2f} | {g - b:.2f} | {e:.2f} |", flush=True)
    print(f"worst overhead {worst:.2f} us per guarded call (goal: <= 3 us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
