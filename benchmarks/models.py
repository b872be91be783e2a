"""End to end on the reference models: eager, torch.compile, forge over eager, forge with torch.compile.

For each zoo model: `forge optimize` (recipe policy, the given budget) gives the patched model and eager
and forge times measured interleaved in one process; then torch.compile of the eager model and of the
patched model (Inductor compiles what lies between forge's kernels, which are opaque calls to it) are
timed against eager the same way (interleaved medians, CUDA events). Outputs of every variant are
compared with eager on fresh inputs.

    python benchmarks/models.py --device cuda --dtype bf16 --models resnet50 sd35-vae-decoder ...
    python benchmarks/models.py --device cpu --models resnet50 --batch 2 --resolution 64 --budget 8   # smoke

Prints a markdown table (and --json rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.endtoend import interleaved_ms, outputs_match  # noqa: E402
from forge.model_input import load_zoo  # noqa: E402
from forge.optimize import optimize  # noqa: E402
from forge.search import Budget  # noqa: E402
from forge.store import Store  # noqa: E402


def run_model(name: str, args: argparse.Namespace, sizes: dict[str, int], store: Store, tmp: str) -> dict:
    """One model: optimize, then the torch.compile variants, all against eager."""
    start = time.monotonic()
    loaded = load_zoo(name, args.device, args.dtype, **sizes)
    report = optimize(loaded, store, budget=Budget(candidates=args.budget, seconds=args.seconds),
                      runs_dir=Path(tmp) / "runs")
    row = {"model": name, "dtype": args.dtype, "eager_ms": report.eager_ms, "forge_ms": report.forge_ms,
           "forge_x": report.speedup, "applied": report.applied, "forge_match": report.outputs_match,
           "search_min": (time.monotonic() - start) / 60}
    if not args.compile:
        return row
    from forge import artifact

    model, inputs, device = loaded.model, loaded.inputs, loaded.device
    compiled = torch.compile(model)
    eager_ms, compile_ms = interleaved_ms(lambda: model(*inputs), lambda: compiled(*inputs), device)
    row.update(compile_ms=compile_ms, compile_x=eager_ms / compile_ms)
    if report.applied:
        both = torch.compile(artifact.load(report.artifact, model, inputs))
        _, both_ms = interleaved_ms(lambda: compiled(*inputs), lambda: both(*inputs), device)
        fresh = [torch.randn_like(x) if x.is_floating_point() else x for x in inputs]
        match, _ = outputs_match(model, both, fresh)
        row.update(forge_compile_ms=both_ms, over_compile_x=compile_ms / both_ms, both_match=match)
    return row


def fmt(row: dict, key: str) -> str:
    """A number of the table, or '-'."""
    return f"{row[key]:.2f}" if isinstance(row.get(key), float) else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--budget", type=int, default=48, help="candidates over all tasks of a model")
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True, help="also torch.compile")
    for name in ("layers", "batch", "seq", "resolution"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--json")
    args = p.parse_args()
    sizes = {k: getattr(args, k) for k in ("layers", "batch", "seq", "resolution") if getattr(args, k)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/models.db")
        for name in args.models:
            rows.append(run_model(name, args, sizes, store, tmp))
            print(json.dumps(rows[-1]), flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\n{name}; torch {torch.__version__}; budget {args.budget} candidates; sizes {sizes or 'default'}\n")
    print("| model | eager ms | torch.compile ms | forge ms | forge x | forge+compile ms | over compile x | match |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {fmt(r, 'eager_ms')} | {fmt(r, 'compile_ms')} | {fmt(r, 'forge_ms')} | "
              f"{fmt(r, 'forge_x')} | {fmt(r, 'forge_compile_ms')} | {fmt(r, 'over_compile_x')} | "
              f"{r['forge_match']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
