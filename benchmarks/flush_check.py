"""How the L2 flush before a timed call changes a memory-bound kernel's time (a plain device copy).

A flush that writes (Triton's do_bench zeroes a buffer) leaves up to an L2 of dirty lines; a kernel that
then reads evicts them and pays for their write-back. A flush that writes and then reads leaves clean
lines, and so does one that only reads (forge's `Clock.flush`, at half the cost). Prints median
microseconds and the implied rate for copies of several sizes under each flush.

    python benchmarks/flush_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.bench import Clock  # noqa: E402


def main() -> None:
    dev = "cuda"
    buf = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    sink = torch.empty(1, dtype=torch.int64, device=dev)
    flushes = {
        "write (zero_)": lambda: buf.zero_(),
        "write+read": lambda: (buf.zero_(), torch.sum(buf.view(torch.int64), dim=0, out=sink)),
        "read": lambda: torch.sum(buf.view(torch.int64), dim=0, out=sink),
        "Clock.flush (int32 max)": Clock(dev).flush,
    }
    print("| copy MB (in+out) | flush | median us | GB/s |")
    print("|---|---|---|---|")
    for mb in (8, 16, 32, 64, 256):
        src = torch.randn(mb << 18, device=dev)
        dst = torch.empty_like(src)
        for name, flush in flushes.items():
            times = []
            for _ in range(50):
                torch.cuda.synchronize()
                flush()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                dst.copy_(src)
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            med = sorted(times)[len(times) // 2]
            print(f"| {2 * mb} | {name} | {med:.1f} | {2 * mb * 2**20 / med / 1e3:.0f} |")


if __name__ == "__main__":
    main()
