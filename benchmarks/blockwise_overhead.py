"""Block-wise dispatch's cost per block call: the model eager, as one patched graph, and block by block.

The model is tests/models/stacked_rms_blocks.py (blocks of a hand-written RMSNorm, x * silu(x), a projection
and a residual add), with no kernels: what is left between the whole graph and the block-wise forward is
the block-wise runtime's own work (the call's lookup, the graph's arguments, its outputs), once a block.
The three are timed in turn as forge times its variants (forge.runtime.endtoend.alternate: on the CPU in
alternating blocks of calls, the first of each not counted); the median per forward over `--runs` samples is
reported with its spread (the quartiles), and the cost a block call as the median and quartiles of the
differences of samples taken in the same turn.
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
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", type=int, nargs=3, default=[2, 32, 128], help="the input's shape (last: the width)")
    p.add_argument("--depth", type=int, default=8, help="blocks")
    p.add_argument("--runs", type=int, default=300, help="timed forwards of each, at least")
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
    from forge.runtime.endtoend import alternate

    torch.manual_seed(0)
    model = Model(args.shape[-1], args.depth).eval().to(args.device)
    x = torch.randn(*args.shape, device=args.device)
    whole, blocks = apply(model, [x], []), apply_blockwise(model, [x], [])
    assert blocks is not None and blocks.blocks == args.depth
    fns = {"eager": lambda: model(x), "whole graph": lambda: whole(x), "block-wise": lambda: blocks(x)}
    with torch.no_grad():
        for fn in fns.values():
            torch.testing.assert_close(fn(), model(x))
    us = {k: [ms * 1e3 for ms in v] for k, v in zip(fns, alternate(list(fns.values()), args.device, args.runs),
                                                      strict=True)}
    spread = {k: _quartiles(v) for k, v in us.items()}
    diffs = [(b - w) / args.depth for b, w in zip(us["block-wise"], us["whole graph"], strict=True)]
    per_block = _quartiles(diffs)
    row = {**stamp(args.device), "forge": "checkout" if args.forge is None else "--forge tree",
           "shape": args.shape, "depth": args.depth, "runs": len(us["eager"]),
           "us": spread,
           "per_block_call_us": per_block}
    print(f"{args.depth} blocks, input {args.shape} on {row['device']}, forge from {forge.__file__} "
          f"(commit {row['commit']}); median of {row['runs']} forwards each")
    print("| forward | median us | first quartile | third quartile |")
    print("|---|---|---|---|")
    for k, q in spread.items():
        print(f"| {k} | {q['median']:.1f} | {q['q1']:.1f} | {q['q3']:.1f} |")
    print(f"block-wise over the whole graph: {per_block['median']:.1f} us a block call "
          f"(quartiles {per_block['q1']:.1f} to {per_block['q3']:.1f})")
    if args.json:  # a list of rows: this run's appended
        rows = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*rows, row], indent=1) + "\n")
    return 0


def _quartiles(samples: list[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(samples, n=4)
    return {"median": median, "q1": q1, "q3": q3}


if __name__ == "__main__":
    sys.exit(main())
