"""A fair clock (issue 13 item 8): a kernel that does exactly eager's work, timed against eager two ways.

The "kernel" is eager's own ATen op through its `out=` overload, so any speedup is the protocol's, not the
code's. Timed with forge's clock (forge.bench.interleaved: cache flush, candidate and eager call by call):
- `reused`: the kernel writes into one output allocated once (how forge timed candidates before);
- `fresh`: the kernel's output allocated inside each timed call, with torch.empty_strided, as forge's worker
  (forge.evaluate.spotcheck.SpotCheck.wrap) and its dispatcher (forge.runtime.dispatch) do;
- `both reused`: eager's op into a reused buffer too (the other fair option; not general: eager is a graph).
Speedup = eager median / kernel median. Prints a table and writes JSON with the commit and the date.

    python benchmarks/fair_clock.py [--out benchmarks/results/cpu-fair-clock.json] [--device cpu]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

from forge.bench import BenchConfig, Clock, interleaved

log = logging.getLogger("fair_clock")
aten = torch.ops.aten
Op = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor, torch.Tensor], object]]

# name -> (eager, the same op writing into `out`)
OPS: dict[str, Op] = {
    "softmax": (lambda x: torch.softmax(x, -1), lambda x, o: aten._softmax.out(x, -1, False, out=o)),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), lambda x, o: aten._log_softmax.out(x, -1, False, out=o)),
    "hardtanh": (lambda x: torch.nn.functional.hardtanh(x), lambda x, o: aten.hardtanh.out(x, -1.0, 1.0, out=o)),
}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure(name: str, shape: tuple[int, ...], device: str, cfg: BenchConfig, clock: Clock) -> dict[str, object]:
    """One op's three protocols: kernel and eager medians (us) and speedups."""
    eager, into = OPS[name]
    x = torch.randn(shape, device=device)
    reused = torch.empty_like(x)
    eager_out = torch.empty_like(x)

    def fresh() -> None:
        into(x, torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device))

    protocols: dict[str, list[Callable[[], object]]] = {
        "reused": [lambda: into(x, reused), lambda: eager(x)],
        "fresh": [fresh, lambda: eager(x)],
        "both reused": [lambda: into(x, reused), lambda: into(x, eager_out)],
    }
    row: dict[str, object] = {"op": name, "shape": list(shape)}
    with torch.no_grad():
        for proto, fns in protocols.items():
            kern, base = interleaved(clock, fns, cfg)
            row[proto] = {"kernel_us": round(kern.median_us, 1), "eager_us": round(base.median_us, 1),
                          "speedup": round(base.median_us / kern.median_us, 3), "n": kern.n}
    return row


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu-fair-clock.json"))
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of timing per op and protocol")
    args = ap.parse_args()
    cfg = BenchConfig(warmup_s=0.2, budget_s=args.budget, min_runs=15, max_runs=200)
    clock = Clock(args.device)
    shapes = {"softmax": (32, 393216), "log_softmax": (32, 393216), "hardtanh": (32, 393216)}
    rows = [measure(name, shape, args.device, cfg, clock) for name, shape in shapes.items()]
    log.info("%-12s %-12s %28s %28s %28s", "op", "shape", "reused: kernel/eager x", "fresh: kernel/eager x",
             "both reused: kernel/eager x")
    for r in rows:
        cells = [f"{r[p]['kernel_us']:.0f}/{r[p]['eager_us']:.0f} us {r[p]['speedup']:.2f}x"  # type: ignore[index]
                 for p in ("reused", "fresh", "both reused")]
        log.info("%-12s %-12s %28s %28s %28s", r["op"], "x".join(map(str, r["shape"])), *cells)  # type: ignore[arg-type]
    meta = {"commit": _commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": args.device, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "bench": dataclasses.asdict(cfg)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
