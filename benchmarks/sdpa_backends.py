"""Each scaled-dot-product-attention backend torch has, on the attention shapes of the reference models.

For every shape: cuDNN, flash, memory-efficient and the math fallback, each through
`torch.nn.attention.sdpa_kernel([backend])`, timed interleaved in one process with forge's clock (L2 flushed
before each call, CUDA events, medians with p10-p90), outputs compared with the math backend in fp32. Tells
whether the backend torch picks by default is the fastest one (what an attention-backend rewrite would
choose end to end). Where the FlashAttention 4 package (`flash-attn-4`, CuTe DSL: `flash_attn.cute`) imports,
its forward is a row too, called directly (it runs on compute capability 9.0 and 10.0; its first call compiles,
and the seconds are recorded). The inputs are stored [batch, length, heads, width], as a model's projections
leave them, and handed to torch's backends transposed (a view, as the models do) and to FlashAttention 4 as
they are.

  python3 benchmarks/sdpa_backends.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from provenance import stamp  # benchmarks/, on sys.path as the script's folder
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from forge.bench import BenchConfig, Clock, interleaved
from forge.runtime.rewrite_fa4 import fa4

# (name, batch, heads, key/value heads, query length, key length, head width, causal, sliding window or 0)
SHAPES = [
    ("sd35-mmdit joint attention", 2, 24, 24, 4429, 4429, 64, False, 0),
    ("sd35-mmdit self-attention", 2, 24, 24, 4096, 4096, 64, False, 0),
    ("sd35-vae mid-block attention", 1, 1, 1, 16384, 16384, 512, False, 0),
    ("gemma4 sliding layer (mask)", 1, 8, 1, 2048, 2048, 256, False, 512),
    ("gemma-like prefill, causal", 1, 8, 8, 2048, 2048, 256, True, 0),
    ("llama-like prefill, causal", 1, 32, 32, 2048, 2048, 128, True, 0),
]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def one_shape(clock: Clock, shape: tuple, cfg: BenchConfig) -> dict:
    """Every backend that accepts this shape, timed in turn; its error against fp32 math. A sliding window is
    a boolean mask for torch's backends (as transformers hands it to SDPA, its one key/value head expanded over
    the heads) and FlashAttention 4's own window (keys outside it skipped, not masked)."""
    name, b, h, h_kv, lq, lk, d, causal, window = shape
    qs = torch.randn(b, lq, h, d, device="cuda", dtype=torch.bfloat16)
    ks, vs = (torch.randn(b, lk, h_kv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q, k, v = (t.transpose(1, 2).expand(-1, h, -1, -1) for t in (qs, ks, vs))
    mask = None
    if window:
        i = torch.arange(lq, device="cuda")[:, None] + (lk - lq)
        j = torch.arange(lk, device="cuda")[None, :]
        mask = ((j <= i) & (j > i - window))[None, None]
    with sdpa_kernel([SDPBackend.MATH]):
        ref = sdpa(q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal)
    fns, row = {}, {"shape": name, "dims": [b, h, h_kv, lq, lk, d], "causal": causal, "window": window,
                    "backends": {}}
    calls = {}
    for key, backend in BACKENDS.items():
        def call(backend: SDPBackend = backend) -> torch.Tensor:
            with sdpa_kernel([backend]):
                return sdpa(q, k, v, attn_mask=mask, is_causal=causal)
        calls[key] = call
    if (mod := fa4()) is not None:
        size = (window - 1, 0) if window else (None, None)
        calls["fa4"] = lambda: mod.flash_attn_func(qs, ks, vs, causal=causal or bool(window),
                                                   window_size=size)[0].transpose(1, 2)
    for key, call in calls.items():
        start = time.monotonic()
        try:
            out = call()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape (CuTe DSL raises its own)
            row["backends"][key] = {"error": str(e).splitlines()[0][:200] if str(e) else type(e).__name__}
            continue
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        row["backends"][key] = {"max_rel_err": err, "first_call_s": time.monotonic() - start}
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
    rows: list[dict] = []
    for shape in SHAPES:  # written as each shape ends: a later one that kills the process loses only itself
        rows.append({**one_shape(clock, shape, cfg), **stamp("cuda")})
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    names = [*BACKENDS, *(["fa4"] if fa4() is not None else [])]
    print("\n| shape | " + " | ".join(f"{k} us" for k in names) + " |")
    print("|---|" + "---|" * len(names))
    for r in rows:
        cells = []
        for k in names:
            c = r["backends"].get(k, {})
            cells.append(f"{c['median_us']:.0f} ({c['p10_us']:.0f}-{c['p90_us']:.0f})" if "median_us" in c
                         else "refused")
        print(f"| {r['shape']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
