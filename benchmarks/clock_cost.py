"""What one timed call costs the clock on a device (issue 13's throughput): wall time per `Clock.time_us` of a
no-op and of an op, the flush and the flushes it replaced (events), and a round of the interleaved timing.

    python benchmarks/clock_cost.py --device cuda [--json out.json]

Prints a table: what, calls, wall us a call (median over repeats), GPU us a call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provenance import stamp  # noqa: E402  (benchmarks/)

from forge.bench import BenchConfig, Clock, interleaved  # noqa: E402


def wall_us(fn, calls: int, repeats: int = 5) -> float:
    """Median over repeats of the wall time a call, in microseconds."""
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def gpu_us(fn, calls: int = 50) -> float:
    """GPU time a call of fn (events around a batch), in microseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def queue_us(fn, calls: int = 200) -> float:
    """Median CPU time to queue one call of fn (no synchronisation around it, the GPU kept busy by a long
    sleep first so nothing waits): what the flush's GPU time must cover for the clock to see the GPU's time."""
    per = []
    for _ in range(calls // 20):
        torch.cuda._sleep(50_000_000)  # cycles: tens of ms, longer than the 20 calls take to queue
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            per.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def queue_rows(x: torch.Tensor, gelu) -> list[tuple[str, float, float]]:
    """CPU queueing time of eager's GELU and of a Triton copy's launch (wall column), set against the flush's
    GPU time in the table: a path longer than the flush is timed, not hidden."""
    rows = [("queue: eager gelu", queue_us(gelu), 0.0)]
    try:
        from flush_check import triton_copies
        copy = triton_copies()["triton copy"]
    except (ImportError, KeyError):
        return rows
    y = torch.empty_like(x)
    copy(x, y)  # compiled
    return [*rows, ("queue: triton launch (a copy)", queue_us(lambda: copy(x, y)), 0.0),
            ("queue: empty_like + triton launch", queue_us(lambda: copy(x, torch.empty_like(x))), 0.0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dev = args.device
    clock = Clock(dev)
    x = torch.randn(4429, 6144, device=dev, dtype=torch.bfloat16)
    gelu = lambda: torch.nn.functional.gelu(x, approximate="tanh")  # noqa: E731
    fill = lambda: clock.flush_buf.fill_(1)  # noqa: E731
    sink64 = torch.empty((), dtype=torch.int64, device=dev)
    read = lambda: torch.sum(clock.flush_buf, dim=0, dtype=torch.int64, out=sink64)  # noqa: E731
    rows = [("sync alone", wall_us(torch.cuda.synchronize, 200), 0.0),
            ("Clock.flush (read: int32 max)", wall_us(lambda: (clock.flush(), torch.cuda.synchronize()), 100),
             gpu_us(clock.flush)),
            ("fill (Clock.flush wrote it until 2026-12-05)", wall_us(lambda: (fill(), torch.cuda.synchronize()), 100),
             gpu_us(fill)),
            ("read back: sum into int64 (before 2026-12-05)", wall_us(lambda: (read(), torch.cuda.synchronize()), 100),
             gpu_us(read)),
            ("gelu alone", wall_us(lambda: (gelu(), torch.cuda.synchronize()), 100), gpu_us(gelu)),
            ("time_us(no-op)", wall_us(lambda: clock.time_us(lambda: None), 100), 0.0),
            ("time_us(gelu)", wall_us(lambda: clock.time_us(gelu), 100), 0.0)]
    rows += queue_rows(x, gelu)
    buf = clock.flush_buf
    f32, i64 = torch.empty((), device=dev), torch.empty((), dtype=torch.int64, device=dev)
    i32 = torch.empty((), dtype=torch.int32, device=dev)
    reads = {"read back: sum as float32": lambda: torch.sum(buf.view(torch.float32), dim=0, out=f32),
             "read back: sum of int64 view": lambda: torch.sum(buf.view(torch.int64), dim=0, out=i64),
             "read back: amax int32": lambda: torch.amax(buf, dim=0, out=i32),
             "read back: amax as float32": lambda: torch.amax(buf.view(torch.float32), dim=0, out=f32)}
    buf.fill_(0)
    rows += [(what, wall_us(lambda r=r: (r(), torch.cuda.synchronize()), 100), gpu_us(r)) for what, r in reads.items()]
    cfg = BenchConfig(warmup_s=0.0, budget_s=0.0, min_runs=200, max_runs=200)
    t0 = time.perf_counter()
    interleaved(clock, [gelu, gelu], cfg)
    rows.append(("interleaved round (2 x gelu)", (time.perf_counter() - t0) / 203 * 1e6, 0.0))
    print(f"{torch.cuda.get_device_name(dev)}; flush buffer {clock.flush_buf.numel() * 4 >> 20} MiB")
    print("| what | wall us a call | GPU us a call |\n|---|---|---|")
    for what, w, g in rows:
        print(f"| {what} | {w:.1f} | {g:.1f} |")
    if args.json:
        where = stamp(dev)
        Path(args.json).write_text(json.dumps([{"what": a, **where, "wall_us": b, "gpu_us": c} for a, b, c in rows],
                                              indent=1))


if __name__ == "__main__":
    main()
