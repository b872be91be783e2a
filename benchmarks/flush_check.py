"""How the L2 flush before a timed call changes a memory-bound kernel's time (a plain device copy).

A flush that writes (Triton's do_bench zeroes a buffer) leaves up to an L2 of dirty lines; a kernel that
then reads evicts them and pays for their write-back. A flush that writes and then reads leaves clean
lines, and so does one that only reads (forge's `Clock.flush`, at half the cost). "none" is the copy with
its source still in the L2 from the call before (what a flush must prevent). The Triton copies load with
the normal eviction priority and with `evict_last`: if the `evict_last` copy after a flush is as fast as
with none, the flush does not evict lines a kernel asked to keep (docs/verification.md). Prints median
microseconds and the implied rate for copies of several sizes under each flush.

    python benchmarks/flush_check.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provenance import stamp  # noqa: E402  (benchmarks/)

from forge.bench import Clock  # noqa: E402


def triton_copies() -> dict[str, Callable[[torch.Tensor, torch.Tensor], None]]:
    """Copies by a Triton kernel, loads at the normal priority and with evict_last (none without Triton)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return {}

    @triton.jit
    def copy(x, y, n, BLOCK: tl.constexpr, LAST: tl.constexpr):  # noqa: N803
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if LAST:
            v = tl.load(x + offs, mask=mask, eviction_policy="evict_last")
        else:
            v = tl.load(x + offs, mask=mask)
        tl.store(y + offs, v, mask=mask)

    def run(last: bool) -> Callable[[torch.Tensor, torch.Tensor], None]:
        return lambda src, dst: copy[(triton.cdiv(src.numel(), 4096),)](src, dst, src.numel(), BLOCK=4096, LAST=last)

    return {"triton copy": run(False), "triton copy, evict_last": run(True)}


def median_us(flush: Callable[[], object], op: Callable[[], object], reps: int = 50) -> float:
    op()  # compiled, and its source in the L2 for "none"
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        flush()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        op()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dev = "cuda"
    buf = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    sink = torch.empty(1, dtype=torch.int64, device=dev)
    flushes = {
        "none": lambda: None,
        "write (zero_)": lambda: buf.zero_(),
        "write+read": lambda: (buf.zero_(), torch.sum(buf.view(torch.int64), dim=0, out=sink)),
        "read (int64 sum)": lambda: torch.sum(buf.view(torch.int64), dim=0, out=sink),
        "Clock.flush (int32 max)": Clock(dev).flush,
    }
    copies = {"torch copy": lambda src, dst: dst.copy_(src), **triton_copies()}
    rows = []
    print(f"{torch.cuda.get_device_name(dev)}\n| copy MB (in+out) | copy | flush | median us | GB/s |")
    print("|---|---|---|---|---|")
    for mb in (8, 16, 32, 64, 256):
        src = torch.randn(mb << 18, device=dev)
        dst = torch.empty_like(src)
        for copy_name, copy in copies.items():
            for name, flush in flushes.items():
                med = median_us(flush, lambda c=copy, s=src, d=dst: c(s, d))
                rows.append({"copy_mb": 2 * mb, "copy": copy_name, "flush": name, "median_us": med})
                print(f"| {2 * mb} | {copy_name} | {name} | {med:.1f} | {2 * mb * 2**20 / med / 1e3:.0f} |")
    if args.json:
        where = stamp(dev)
        Path(args.json).write_text(json.dumps([{**r, **where} for r in rows], indent=1))


if __name__ == "__main__":
    main()
