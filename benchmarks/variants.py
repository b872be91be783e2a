"""What the whole-graph rewrites and runtimes give the reference models, with no searched kernel at all.

For each zoo model: torch.compile (default and `reduce-overhead`) against eager, then forge.runtime.variants.choose
with no kernels (every rewrite tried greedily on the CUDA-graph runtime, then Inductor with CUDA graphs),
every variant timed interleaved with eager in this process (CUDA events, medians) and its outputs compared
on fresh inputs. One model a process (`--models` takes one; h200_variants.sh loops).

    python benchmarks/variants.py --device cuda --dtype bf16 --models resnet50 --json out/resnet50.json
    python benchmarks/variants.py --device cpu --models resnet50 --batch 2 --resolution 64 --no-compile   # smoke
    python benchmarks/variants.py --models gemma4 --no-compile --variants @inductor-cuda-graph \
        attention-gemm@inductor-cuda-graph   # just these variants (REWRITE+REWRITE@RUNTIME), in this order

Prints a markdown table and writes --json rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provenance import stamp  # noqa: E402  (benchmarks/, on sys.path as the script's folder)

from forge.capture import layout  # noqa: E402
from forge.capture.model_input import load_zoo  # noqa: E402
from forge.runtime.endtoend import interleaved_ms  # noqa: E402
from forge.runtime.variants import Variant, choose, measure  # noqa: E402


def baselines(loaded: Any, row: dict, freezing: bool, extra: list[str]) -> None:
    """torch.compile in its default mode and with CUDA graphs (and any `extra` modes), each against eager."""
    model, inputs, device = loaded.model, loaded.inputs, loaded.device
    modes = [("compile", None), ("compile_ro", "reduce-overhead"),
             *((f"compile_{m.replace('-', '_')}", m) for m in extra)]
    for key, mode in modes:
        start = time.monotonic()
        compiled = torch.compile(model, mode=mode)
        e, c = interleaved_ms(lambda: model(*inputs), lambda f=compiled: f(*inputs), device)
        row[f"{key}_ms"], row[f"{key}_eager_ms"], row[f"{key}_s"] = c, e, time.monotonic() - start
        print(f"{key}: {c:.3f} ms against eager {e:.3f} ({e / c:.2f}x), {time.monotonic() - start:.0f} s",
              flush=True)
        torch._dynamo.reset()
    if freezing:  # Inductor's own inference freezing (folds BatchNorm, constant weights), for comparison
        import torch._inductor.config as cfg

        cfg.freezing = True
        compiled = torch.compile(model, mode="reduce-overhead")
        e, c = interleaved_ms(lambda: model(*inputs), lambda: compiled(*inputs), device)
        row["compile_ro_freezing_ms"], row["compile_ro_freezing_eager_ms"] = c, e
        print(f"compile_ro_freezing: {c:.3f} ms against eager {e:.3f}", flush=True)
        cfg.freezing = False
        torch._dynamo.reset()


def _variant(spec: str) -> Variant:
    """'fold-bn+channels-last@cuda-graph' -> that variant without kernels ('@inductor': the model compiled)."""
    rewrites, _, runtime = spec.partition("@")
    return Variant(False, tuple(r for r in rewrites.split("+") if r), runtime or "cuda-graph")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--freezing", action="store_true", help="also torch.compile with Inductor's freezing")
    p.add_argument("--modes", nargs="*", default=[], metavar="MODE",
                   help="more torch.compile modes to time against eager (e.g. max-autotune)")
    for name in ("layers", "batch", "seq", "resolution"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--variants", nargs="+", metavar="REWRITES@RUNTIME",
                   help="measure just these variants (no kernels), e.g. attention-gemm@inductor-cuda-graph")
    p.add_argument("--layout", choices=layout.CHOICES[1:], default="row-major",
                   help="the capture the variants start from (forge.capture.layout; forge optimize measures which)")
    p.add_argument("--json")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("forge.capture.export", "forge.runtime.rewrites", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sizes = {k: getattr(args, k) for k in ("layers", "batch", "seq", "resolution") if getattr(args, k)}
    rows: list[dict] = []

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")

    for name in args.models:
        row: dict[str, Any] = {"model": name, "dtype": args.dtype, "sizes": sizes, "layout": args.layout,
                               **stamp(args.device)}
        rows.append(row)
        try:
            loaded = load_zoo(name, args.device, args.dtype, **sizes)
            if args.compile:
                baselines(loaded, row, args.freezing, args.modes)
                save()
            start = time.monotonic()
            cap = layout.capture_in(loaded.model, loaded.inputs, layout.requested(args.layout))
            if args.variants:
                tried = [measure(loaded.model, loaded.inputs, [], _variant(v), args.device, cap)[0]
                         for v in args.variants]
                best = min(tried, key=lambda m: m.ms if m.ok else float("inf"))
            else:
                best, tried = choose(loaded.model, loaded.inputs, [], args.device, compile=args.compile, cap=cap)
            row.update(best=best.to_json(), tried=[m.to_json() for m in tried], choose_s=time.monotonic() - start)
        except Exception as e:  # noqa: BLE001 - keep what was measured
            logging.exception("%s failed", name)
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        save()
    print("\n| model | dtype | variant | eager ms | variant ms | x eager | match | peak mem x | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for m in r.get("tried", []):
            peak = f"{m['peak_mem_ratio']:.2f}" if m["peak_mem_ratio"] else "-"
            x = f"{m['eager_ms'] / m['ms']:.2f}" if m["ms"] else "-"
            print(f"| {r['model']} | {r['dtype']} | {m['variant']['name']} | {m['eager_ms']:.3f} | {m['ms']:.3f} | "
                  f"{x} | {m['match']} | {peak} | {m['error'][:60]} |")
        for k in ("compile", "compile_ro", "compile_ro_freezing", *(f"compile_{m.replace('-', '_')}"
                                                                    for m in args.modes)):
            if f"{k}_ms" in r:
                print(f"| {r['model']} | {r['dtype']} | torch.compile {k} | {r[k + '_eager_ms']:.3f} | "
                      f"{r[k + '_ms']:.3f} | {r[k + '_eager_ms'] / r[k + '_ms']:.2f} | - | - | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
