"""Scaling of the search over evaluation workers: candidates per minute with 1, 2, 4, 8 GPUs (as there are).

For each worker count, a fresh build cache (every build a real compile) and a fresh SQLite store, the
recipe policy searches the tasks of a reference model for `--seconds` (the time is what ends it: no per-task
cap that the budget reaches first, no patience stop), with one evaluation worker per GPU (forge optimize
--gpus N; `--ray ADDRESS` measures on a Ray cluster's actors instead, with --workers actors on the CPU). The
rate is the candidates stored by the search (re-timings of the fastest excluded) over the search's wall time.

    python benchmarks/gpu_scaling.py --device cuda --zoo resnet50 --seconds 120 --json out/gpu_scaling.json
    python benchmarks/gpu_scaling.py --device cpu --workers 1 2 --seconds 60    # the same path on the CPU

Prints a table: workers, candidates, passed, wall seconds, candidates per minute, speed-up over one worker.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.capture.model_input import load_file, load_zoo  # noqa: E402
from forge.capture.profile import profile_model  # noqa: E402
from forge.evaluate.cluster import evaluator_for  # noqa: E402
from forge.evaluate.pool import Scale  # noqa: E402
from forge.policy.recipes.policy import RecipePolicy  # noqa: E402
from forge.search.driver import Budget, search  # noqa: E402
from forge.store import Store  # noqa: E402
from forge.store.recorder import StoreRecorder  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def measure(tasks: list, device: str, scale: Scale, seconds: float, model: str) -> dict:
    """One search with `scale`'s workers: its candidates, passes and rate."""
    with tempfile.TemporaryDirectory(prefix="forge-scaling-") as tmp:
        store = Store(Path(tmp) / "f.db")
        run = store.create_run(model, device=device, policy="recipes")
        with evaluator_for(device, scale, cache_dir=Path(tmp) / "cache") as ev:
            n = ev.parallel
            budget = Budget(candidates=100_000, per_task=10_000, min_per_task=4, seconds=seconds,
                            patience=10_000, parallel=max(4, n), min_share=0.0)
            start = time.monotonic()
            search(tasks, RecipePolicy(device), ev, StoreRecorder(store, run.id), budget)
            wall = time.monotonic() - start
            where = ev.device_model
        evals = [e for t in store.get_tasks(run.id) for c in store.candidates(t.id) if c.parent_id is not None
                 for e in store.evaluations(c.id)[:1]]  # the first: later ones are re-timings
    passed = sum(e.status == "ok" for e in evals)
    return {"workers": n, "candidates": len(evals), "passed": passed, "wall_s": round(wall, 1),
            "per_minute": round(60 * len(evals) / wall, 2), "device_model": where}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--zoo", help="a reference model (default on CUDA: resnet50)")
    p.add_argument("--model", help="or a model file (default on the CPU: tests/models/two_tasks.py)")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--batch", type=int, help="zoo: batch size")
    p.add_argument("--workers", type=int, nargs="+", help="worker counts (default: 1 2 4 8, as many as there "
                   "are GPUs)")
    p.add_argument("--seconds", type=float, default=120.0, help="search time per worker count")
    p.add_argument("--ray", metavar="ADDRESS", help="measure on this Ray cluster's actors")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cuda = args.device.startswith("cuda")
    available = torch.cuda.device_count() if cuda else 8
    counts = [n for n in (args.workers or [1, 2, 4, 8]) if n <= available] or [1]
    if cuda and not args.zoo and not args.model:
        args.zoo = "resnet50"
    model = args.zoo or args.model or str(ROOT / "tests" / "models" / "two_tasks.py")
    loaded = (load_zoo(args.zoo, args.device, args.dtype, batch=args.batch) if args.zoo
              else load_file(model, args.device, args.dtype))
    prof, _ = profile_model(loaded, budget_s=1.0)
    tasks = list(prof.tasks)
    rows = []
    for n in counts:
        scale = Scale(n, args.ray) if args.ray else Scale(n)
        rows.append(measure(tasks, args.device, scale, args.seconds, Path(model).stem))
        rows[-1]["speedup_vs_1"] = round(rows[-1]["per_minute"] / rows[0]["per_minute"], 2) if rows[0][
            "per_minute"] else None
        print(f"  {n} worker(s) done: {rows[-1]['per_minute']} candidates/min", file=sys.stderr)
    where = rows[0]["device_model"].split(" [")[0]  # a CPU's ISA flags are many
    print(f"{Path(model).stem} on {where} ({args.dtype}), recipes, {args.seconds:.0f} s a count"
          + (f", Ray at {args.ray}" if args.ray else ""))
    print("| workers | candidates | passed | wall s | cand./min | vs 1 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workers']} | {r['candidates']} | {r['passed']} | {r['wall_s']} | {r['per_minute']} | "
              f"{r['speedup_vs_1']}x |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": model, "device": args.device, "dtype": args.dtype,
                                               "seconds": args.seconds, "ray": args.ray, "rows": rows},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
