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
import dataclasses
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.endtoend import fresh_inputs, interleaved_ms, outputs_match  # noqa: E402
from forge.model_input import load_zoo  # noqa: E402
from forge.optimize import optimize  # noqa: E402
from forge.search import Budget  # noqa: E402
from forge.store import Store  # noqa: E402


def eager_graph(loaded: Any, row: dict, save: Callable[[], None]) -> None:
    """What a CUDA graph alone gives eager (the share of forge's gain that is not its kernels). Last, since a
    forward that cannot be captured may leave the CUDA context unusable."""
    if loaded.device.startswith("cuda"):
        from forge.dispatch import GraphReplay

        try:
            replay = GraphReplay(loaded.model, loaded.inputs)
            e_ms, g_ms = interleaved_ms(lambda: loaded.model(*loaded.inputs), lambda: replay(*loaded.inputs),
                                        loaded.device)
            row.update(eager_graph_ms=g_ms, eager_graph_x=e_ms / g_ms)
        except Exception as e:  # noqa: BLE001 - not capturable: say so in the row
            row["eager_graph_error"] = f"{type(e).__name__}: {e}"[:300]
        save()


def run_model(name: str, args: argparse.Namespace, sizes: dict[str, int], store: Store, tmp: str,
              row: dict, save: Callable[[], None]) -> None:
    """One model: optimize, then the torch.compile variants, all against eager. Fills `row` stage by stage
    and calls `save` after each, so a run cut short keeps what it measured."""
    start = time.monotonic()
    loaded = load_zoo(name, args.device, args.dtype, **sizes)
    profile_out = None
    if args.profiles:
        Path(args.profiles).mkdir(parents=True, exist_ok=True)
        profile_out = Path(args.profiles) / f"{name}.{args.device.split(':')[0]}.{args.dtype}.json"
    report = optimize(loaded, store, budget=Budget(candidates=args.budget, seconds=args.seconds),
                      runs_dir=Path(tmp) / "runs", profile_out=profile_out)
    row.update(eager_ms=report.eager_ms, forge_ms=report.forge_ms, forge_x=report.speedup, applied=report.applied,
               patched_ms=report.patched_ms, forge_match=report.outputs_match,
               search_min=(time.monotonic() - start) / 60,
               cuda_graph=report.cuda_graph, graph_ms=report.graph_ms, graph_note=report.graph_note,
               tasks=[t for t in report.to_json()["tasks"] if t["candidates"]])
    save()
    if not args.compile:
        eager_graph(loaded, row, save)
        return
    from forge import artifact
    from forge.compiled import against_inductor, compile_with

    model, inputs, device = loaded.model, loaded.inputs, loaded.device
    start = time.monotonic()
    compiled = torch.compile(model)
    eager_ms, compile_ms = interleaved_ms(lambda: model(*inputs), lambda: compiled(*inputs), device)
    row.update(compile_ms=compile_ms, compile_x=eager_ms / compile_ms, compile_min=(time.monotonic() - start) / 60)
    save()
    kernels = artifact.read(report.artifact) if report.artifact else []
    if kernels:
        start = time.monotonic()
        duels = against_inductor(kernels, device)
        row.update(kept=sum(d.forge_wins for d in duels), kernels=len(kernels),
                   duels=[dataclasses.asdict(d) for d in duels])
        save()
        both, patched = compile_with(model, inputs, kernels, duels)
        row["used_under_compile"] = len(patched.kernels)
        _, both_ms = interleaved_ms(lambda: compiled(*inputs), lambda: both(*inputs), device)
        fresh = fresh_inputs(inputs)
        match, _ = outputs_match(model, both, fresh)
        row.update(forge_compile_ms=both_ms, over_compile_x=compile_ms / both_ms, both_match=match,
                   both_min=(time.monotonic() - start) / 60)
        save()
    eager_graph(loaded, row, save)


def fmt(row: dict, key: str) -> str:
    """A number of the table, or '-'."""
    return f"{row[key]:.2f}" if isinstance(row.get(key), float) else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--budget", type=int, default=48, help="candidates over all tasks of a model")
    p.add_argument("--seconds", type=float, default=600.0, help="search wall time of a model")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True, help="also torch.compile")
    for name in ("layers", "batch", "seq", "resolution"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--json")
    p.add_argument("--profiles", metavar="DIR", help="also write each model's profile (forge profile's JSON) here")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sizes = {k: getattr(args, k) for k in ("layers", "batch", "seq", "resolution") if getattr(args, k)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/models.db")

        def save() -> None:
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")

        for name in args.models:
            rows.append({"model": name, "dtype": args.dtype, "sizes": sizes})
            try:
                run_model(name, args, sizes, store, tmp, rows[-1], save)
            except Exception as e:  # noqa: BLE001 - one model failing must not lose the others' rows
                logging.exception("%s failed", name)
                rows[-1]["error"] = f"{type(e).__name__}: {e}"[:300]
            save()
            print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("tasks", "duels")}), flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\n{name}; torch {torch.__version__}; budget {args.budget} candidates; sizes {sizes or 'default'}\n")
    print("| model | dtype | eager ms | eager as CUDA graph ms | torch.compile ms | forge ms | forge x | "
          "forge+compile ms | over compile x | kernels kept under compile | outputs match |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        kept = f"{r.get('used_under_compile', r['kept'])} of {r['kernels']}" if "kept" in r else "-"
        match = f"{r.get('forge_match', '-')}" + (f" / {r['both_match']}" if "both_match" in r else "")
        match += f" (failed: {r['error']})" if "error" in r else ""
        graph = " (CUDA graph)" if r.get("cuda_graph") else ""
        print(f"| {r['model']} | {r['dtype']} | {fmt(r, 'eager_ms')} | {fmt(r, 'eager_graph_ms')} | "
              f"{fmt(r, 'compile_ms')} | {fmt(r, 'forge_ms')}{graph} | "
              f"{fmt(r, 'forge_x')} | {fmt(r, 'forge_compile_ms')} | {fmt(r, 'over_compile_x')} | {kept} | {match} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
