"""Block-wise dispatch's cost per block call: the model eager, as one patched graph, and block by block.

The model is tests/models/stacked_rms_blocks.py (blocks of a hand-written RMSNorm, x * silu(x), a projection
and a residual add), with no kernels: what is left between the whole graph and the block-wise forward is
the block-wise runtime's own work (the call's lookup, the graph's arguments, its outputs), once a block.
The three are timed in interleaved batches, in an order that turns every batch (perf_counter_ns; CUDA:
synchronised after each batch); the median per forward over `--batches` batches is reported with the spread
(lowest and highest batch), and the cost a block call as the median and range of the batches' differences.
`--forge TREE --commit SHA` imports forge from TREE (an older tree, e.g. from `git archive SHA forge`).

    python benchmarks/blockwise_overhead.py --json out.json
    python benchmarks/blockwise_overhead.py --forge /tmp/old --commit 2f89915 --json old.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def batches_us(fns: dict[str, Callable[[], object]], calls: int, batches: int, cuda: bool) -> dict[str, list[float]]:
    """Microseconds per call of each function, one sample per batch, the functions interleaved batch by batch
    (each batch starts one function later)."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for b in range(batches):
        for k in keys[b % len(keys):] + keys[:b % len(keys)]:
            fn = fns[k]
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
    p.add_argument("--commit", help="the commit of --forge's tree (required with it)")
    p.add_argument("--json", type=Path, help="append this run's row to the list in this file")
    args = p.parse_args()
    if args.forge and not args.commit:
        p.error("--forge needs --commit: the row says which commit it timed")
    if args.commit:
        os.environ["FORGE_COMMIT"] = args.commit  # provenance.stamp's
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
    diffs = [(b - w) / args.depth for b, w in zip(us["block-wise"], us["whole graph"], strict=True)]
    per_block = {"median": statistics.median(diffs), "lo": min(diffs), "hi": max(diffs)}
    row = {**stamp(args.device), "forge": "checkout" if args.forge is None else "--forge tree",
           "shape": args.shape, "depth": args.depth, "calls": args.calls, "batches": args.batches,
           "us": {k: {"median": med[k], "lo": min(v), "hi": max(v)} for k, v in us.items()},
           "per_block_call_us": per_block}
    print(f"{args.depth} blocks, input {args.shape} on {row['device']}, forge from {forge.__file__} "
          f"(commit {row['commit']}); median of {args.batches} batches of {args.calls} forwards")
    print("| forward | median us | lowest | highest |")
    print("|---|---|---|---|")
    for k, v in us.items():
        print(f"| {k} | {med[k]:.1f} | {min(v):.1f} | {max(v):.1f} |")
    print(f"block-wise over the whole graph: {per_block['median']:.1f} us a block call "
          f"({per_block['lo']:.1f} to {per_block['hi']:.1f} over the batches)")
    if args.json:  # a list of rows: this run's appended
        rows = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*rows, row], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
