"""Block-wise dispatch's cost per block call: the model eager, as one patched graph, and block by block.

The model is tests/models/stacked_rms_blocks.py (blocks of a hand-written RMSNorm, x * silu(x), a projection
and a residual add), with no kernels: what is left between the whole graph and the block-wise forward is
the block-wise runtime's own work (the call's lookup, the graph's arguments, its outputs), once a block.
The three are timed in interleaved batches (perf_counter_ns; CUDA: synchronised after each batch); the
median per forward over `--batches` batches is reported with the spread (lowest and highest batch).
`--forge TREE` imports forge from TREE (an older tree, e.g. from `git archive`), to compare commits.

    python benchmarks/blockwise_overhead.py --json out.json
    python benchmarks/blockwise_overhead.py --forge /tmp/old --json old.json   # the same on an older tree
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def batches_us(fns: dict[str, Callable[[], object]], calls: int, batches: int, cuda: bool) -> dict[str, list[float]]:
    """Microseconds per call of each function, one sample per batch, the functions interleaved batch by batch."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(batches):
        for k, fn in fns.items():
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            if cuda:
                torch.cuda.synchronize()
            out[k].append((time.perf_counter_ns() - t0) / calls / 1e3)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", type=int, nargs=3, default=[2, 32, 128], help="the input's shape (last: the width)")
    p.add_argument("--depth", type=int, default=8, help="blocks")
    p.add_argument("--calls", type=int, default=50, help="forwards per timed batch")
    p.add_argument("--batches", type=int, default=21)
    p.add_argument("--forge", type=Path, help="import forge from this tree instead of the checkout's")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    sys.path[:0] = [str(args.forge or ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests" / "models")]
    from provenance import stamp
    from stacked_rms_blocks import Model

    import forge
    from forge.runtime.blockwise import apply_blockwise
    from forge.runtime.dispatch import apply

    torch.manual_seed(0)
    model = Model(args.shape[-1], args.depth).eval().to(args.device)
    x = torch.randn(*args.shape, device=args.device)
    whole, blocks = apply(model, [x], []), apply_blockwise(model, [x], [])
    assert blocks is not None and blocks.blocks == args.depth
    fns = {"eager": lambda: model(x), "whole graph": lambda: whole(x), "block-wise": lambda: blocks(x)}
    with torch.no_grad():
        for fn in fns.values():
            torch.testing.assert_close(fn(), model(x))
            for _ in range(args.calls):
                fn()
        us = batches_us(fns, args.calls, args.batches, args.device != "cpu")
    med = {k: statistics.median(v) for k, v in us.items()}
    per_block = (med["block-wise"] - med["whole graph"]) / args.depth
    row = {**stamp(args.device), "forge_tree": str(args.forge or ROOT), "forge_file": forge.__file__,
           "shape": args.shape, "depth": args.depth, "calls": args.calls, "batches": args.batches,
           "us": {k: {"median": med[k], "lo": min(v), "hi": max(v)} for k, v in us.items()},
           "per_block_call_us": per_block}
    print(f"{args.depth} blocks, input {args.shape} on {row['device']}, forge from {forge.__file__} "
          f"(commit {row['commit']}); median of {args.batches} batches of {args.calls} forwards")
    print("| forward | median us | lowest | highest |")
    print("|---|---|---|---|")
    for k, v in us.items():
        print(f"| {k} | {med[k]:.1f} | {min(v):.1f} | {max(v):.1f} |")
    print(f"block-wise over the whole graph: {per_block:.1f} us a block call")
    if args.json:
        args.json.write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
