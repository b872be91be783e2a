"""Each scaled-dot-product-attention backend torch has, on the attention shapes of the reference models.

For every shape: cuDNN, flash, memory-efficient and the math fallback, each through
`torch.nn.attention.sdpa_kernel([backend])`, timed interleaved in one process with forge's clock (L2 flushed
before each call, CUDA events, medians with p10-p90), outputs compared with the math backend in fp32. Tells
whether the backend torch picks by default is the fastest one (what an attention-backend rewrite would
choose end to end).

  python3 benchmarks/sdpa_backends.py --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from provenance import stamp  # benchmarks/, on sys.path as the script's folder
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from forge.bench import BenchConfig, Clock, interleaved

# (name, batch, heads, query length, key length, head width, causal)
SHAPES = [
    ("sd35-mmdit joint attention", 2, 24, 4429, 4429, 64, False),
    ("sd35-vae mid-block attention", 1, 1, 16384, 16384, 512, False),
    ("gemma-like prefill, causal", 1, 8, 2048, 2048, 256, True),
    ("llama-like prefill, causal", 1, 32, 2048, 2048, 128, True),
]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def one_shape(clock: Clock, shape: tuple, cfg: BenchConfig) -> dict:
    """Every backend that accepts this shape, timed in turn; its error against fp32 math."""
    name, b, h, lq, lk, d, causal = shape
    q = torch.randn(b, h, lq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, h, lk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with sdpa_kernel([SDPBackend.MATH]):
        ref = sdpa(q.float(), k.float(), v.float(), is_causal=causal)
    fns, row = {}, {"shape": name, "dims": [b, h, lq, lk, d], "causal": causal, "backends": {}}
    for key, backend in BACKENDS.items():
        def call(backend: SDPBackend = backend) -> torch.Tensor:
            with sdpa_kernel([backend]):
                return sdpa(q, k, v, is_causal=causal)
        try:
            out = call()
        except RuntimeError as e:
            row["backends"][key] = {"error": str(e).splitlines()[0][:200]}
            continue
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        row["backends"][key] = {"max_rel_err": err}
        fns[key] = call
    timings = interleaved(clock, list(fns.values()), cfg)
    for key, t in zip(fns, timings, strict=True):
        row["backends"][key].update(median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, n=t.n)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--seconds", type=float, default=2.0, help="timing budget a shape")
    args = ap.parse_args()
    clock = Clock("cuda")
    cfg = BenchConfig(warmup_s=0.2, budget_s=args.seconds, min_runs=10, max_runs=100)
    rows = [{**one_shape(clock, s, cfg), **stamp("cuda")} for s in SHAPES]
    print("\n| shape | " + " | ".join(f"{k} us" for k in BACKENDS) + " |")
    print("|---|" + "---|" * len(BACKENDS))
    for r in rows:
        cells = []
        for k in BACKENDS:
            c = r["backends"].get(k, {})
            cells.append(f"{c['median_us']:.0f} ({c['p10_us']:.0f}-{c['p90_us']:.0f})" if "median_us" in c
                         else "refused")
        print(f"| {r['shape']} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
