"""Does a candidate's timing hold while compilers run beside it? (forge.bench's PAD_US, forge.evaluate.build's
BUILD_NICE.)

forge builds candidates on every CPU core while its worker times others. This times, with forge's own clock
(forge.bench.interleaved, cache flushed before every call), an eager RMSNorm (six launches from Python, as a
Helion or Triton candidate's launch path is Python too) and one single-op call, under three loads: none; one
real compiler loop per core (nvcc where there is one, else c++) at niceness 0, as forge ran its builds before;
the same at BUILD_NICE. On CUDA each load is timed with the GPU pad (PAD_US) and without it (the flush alone).
Conditions run in turn, `--repeats` times; the table gives the median over repeats of each timing's median,
p10 and p90. `--helion FILE`: also a Helion candidate module of the SiLU x mul task (two f32[1024, 1376]
inputs; its `launch(inputs, outputs)`), e.g. benchmarks/data/helion_silu_mul_*.py: the recipe's, and the
configs Helion's autotuner chose in two forge optimize runs on an H100 (at 3730555, unseeded, and 124a2c5). A
second table gives each op's launch path: the CPU time of a call from its start until it returns, the GPU idle
(synchronised before), against the flush's GPU time.

    python3 benchmarks/launch_path.py --device cuda --helion benchmarks/data/helion_silu_mul_*.py --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.provenance import stamp  # noqa: E402
from forge.bench import PAD_US, BenchConfig, Clock, interleaved, time_call_us  # noqa: E402
from forge.evaluate.build import BUILD_NICE  # noqa: E402

SOURCE = "__global__ void k(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2; }\n"


def compilers(n: int, nice: int, folder: Path) -> list[subprocess.Popen[bytes]]:
    """`n` shell loops, each compiling a small file again and again at niceness `nice`."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    src = folder / ("k.cu" if nvcc else "k.cpp")
    src.write_text(SOURCE if nvcc else "int f(int x) { return x * 2; }\n" * 200)
    cc = f"{nvcc} -O3 -c" if nvcc else "c++ -O2 -c"
    loop = f"while true; do {cc} {src} -o {folder}/k$$.o >/dev/null 2>&1; done"
    return [subprocess.Popen(["nice", "-n", str(nice), "sh", "-c", loop], start_new_session=True) for _ in range(n)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def helion_op(path: str, dev: str) -> tuple[str, Callable[[], object]]:
    """A Helion candidate module's launch on the SiLU x mul task's shapes, outputs allocated in the call."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a, b = (torch.randn(1024, 1376, device=dev) for _ in range(2))

    def call() -> object:
        out = torch.empty_like(a)
        assert mod.launch([a, b], [out]) == 0
        return out

    return f"Helion {Path(path).stem} (1 launch)", call


def launch_path(fn: Callable[[], object], cuda: bool, n: int = 200) -> tuple[float, float]:
    """The CPU time of a call (median, p90 us), the device idle before each: what the flush must cover."""
    times = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    times.sort()
    return statistics.median(times), times[int(0.9 * (n - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--helion", nargs="*", default=[], help="Helion candidate modules of the SiLU x mul task")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    dev, cores = args.device, os.cpu_count() or 1
    x = torch.randn(4, 256, 512, device=dev)
    w = torch.randn(512, device=dev)
    ops = {"eager RMSNorm (6 launches)": lambda: rmsnorm(x, w), "x * 2 (1 launch)": lambda: x * 2}
    ops.update(helion_op(p, dev) for p in args.helion)
    pads = [0.0, PAD_US] if dev.startswith("cuda") else [0.0]
    clocks = {p: Clock(dev, pad_us=p) for p in pads}
    cfg = BenchConfig(warmup_s=0.05, budget_s=0.5, min_runs=10, max_runs=200)
    loads = {"none": None, "compilers, nice 0": 0, f"compilers, nice {BUILD_NICE}": BUILD_NICE}
    seen: dict[tuple[str, str, float], list[tuple[float, float, float]]] = {}
    paths: dict[tuple[str, str], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for load, nice in loads.items():
                procs = compilers(cores, nice, Path(tmp)) if nice is not None else []
                time.sleep(1.0 if procs else 0.0)  # the loops under way
                try:
                    for name, fn in ops.items():
                        paths[(name, load)] = launch_path(fn, dev.startswith("cuda"))
                    for pad, clock in clocks.items():
                        for name, fn in ops.items():
                            (t,) = interleaved(clock, [fn], cfg)
                            seen.setdefault((name, load, pad), []).append((t.median_us, t.p10_us, t.p90_us))
                finally:
                    stop(procs)
    rows = [{"op": name, "load": load, "pad_us": pad, "median_us": statistics.median(v[0] for v in vals),
             "p10_us": statistics.median(v[1] for v in vals), "p90_us": statistics.median(v[2] for v in vals),
             "repeats": len(vals)} for (name, load, pad), vals in seen.items()]
    print(f"| op | load ({cores} cores) | GPU pad us | median us | p10 us | p90 us |")
    print("|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["op"], r["pad_us"], list(loads).index(r["load"]))):
        print(f"| {r['op']} | {r['load']} | {r['pad_us']:g} | {r['median_us']:.2f} | {r['p10_us']:.2f} | "
              f"{r['p90_us']:.2f} |")
    flush = statistics.median(time_call_us(clocks[0.0].flush, dev.startswith("cuda")) for _ in range(50))
    print(f"\nlaunch path (CPU us a call, the last repeat's; the flush takes {flush:.1f} us of GPU time, the pad "
          f"{PAD_US:g} more)\n\n| op | load | median us | p90 us |\n|---|---|---|---|")
    for (name, load), (med, p90) in paths.items():
        print(f"| {name} | {load} | {med:.1f} | {p90:.1f} |")
    if args.json:
        launch = [{"op": n, "load": ld, "median_us": m, "p90_us": p} for (n, ld), (m, p) in paths.items()]
        Path(args.json).write_text(json.dumps({**stamp(dev), "flush_us": flush, "pad_us": PAD_US, "rows": rows,
                                               "launch_path": launch}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
