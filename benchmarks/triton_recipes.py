"""Triton (or Helion) recipe kernels against the CUDA recipes, eager and torch.compile on the seven anchor tasks.

For each anchor (benchmarks/anchors.py: the shapes and dtypes of ../shared/ANCHORS.md) the recipe policy's
root schedules and their one-knob mutations of each backend (CUDA C++, and Triton or with `--backend helion`
Helion) are evaluated by forge's evaluator (checks, build, verification, timing with L2 flushed and eager
interleaved), up to `--per-backend` candidates each; the best verified one of each backend is reported, with the
wall time spent evaluating that backend's candidates (the recipes' tuning time: Triton's and Helion's include
their JIT compiles; the search tunes Helion's config). With `--autotune SECONDS` (Helion), the best Helion
candidate then goes to Helion's own autotuner (forge.evaluate.autotune, in the worker for Python candidates,
`--effort`, at most SECONDS a kernel), and the candidate with the config it chose is judged as any other; the
search's best and the autotuned one are then timed again one after the other (forge.search.confirm's bench).
Eager and torch.compile (max-autotune-no-cudagraphs) are timed in this process with forge's clock, as
benchmarks/anchors.py does.

    python benchmarks/triton_recipes.py [--backend triton|helion] [--only NAME ...] [--per-backend 12] [--json PATH]
        [--autotune SECONDS [--effort quick|full]]

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _best(ev, spec, policy, roots: list, limit: int) -> dict:
    """Evaluate `roots` and then mutations of the best so far (one level at a time) until `limit` candidates;
    the best verified median, how many passed and the wall time."""
    start, tried, passed, best, best_knobs, failures = time.monotonic(), 0, 0, None, None, {}
    best_cand = None
    messages: dict[str, str] = {}  # the first message of each failing status
    frontier = list(roots)
    while frontier and tried < limit:
        batch, frontier = frontier[: limit - tried], []
        cands = [policy.render(spec, k) for k in batch]
        for knobs, res in zip(batch, ev.evaluate_many(spec, cands), strict=True):
            tried += 1
            if res.status.passed and res.timing:
                passed += 1
                if best is None or res.timing.median_us < best:
                    best, best_knobs, best_cand = res.timing.median_us, knobs, policy.render(spec, knobs)
            else:
                failures[res.status.value] = failures.get(res.status.value, 0) + 1
                messages.setdefault(res.status.value, (res.message or res.build_log)[-600:])
        if best_knobs is not None:
            frontier = policy.propose(spec, best_knobs)
    return {"us": best, "knobs": repr(best_knobs), "tried": tried, "passed": passed, "failures": failures,
            "messages": messages, "tune_s": time.monotonic() - start, "cand": best_cand}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="anchor names")
    p.add_argument("--per-backend", type=int, default=12, help="candidates evaluated per backend and anchor")
    p.add_argument("--json", help="write the rows as JSON")
    p.add_argument("--backend", choices=("triton", "helion"), default="triton", help="the Python recipes beside CUDA")
    p.add_argument("--autotune", type=int, default=0, help="Helion: seconds a kernel for Helion's autotuner (0: none)")
    p.add_argument("--effort", choices=("quick", "full"), default="quick", help="Helion's autotune effort")
    args = p.parse_args()

    from anchors import ANCHORS, module, tasks_of
    from provenance import stamp

    from forge.bench import Clock
    from forge.evaluate.evaluator import Evaluator
    from forge.kernel import TaskSpec
    from forge.policy.recipes.policy import RecipePolicy

    device = "cuda"
    clock = Clock(device)
    rows = []
    with Evaluator(device) as ev:
        for a in ANCHORS:
            if args.only and a.name not in args.only:
                continue
            task = max(tasks_of(a, device), key=lambda t: t.bytes or 0)
            spec = TaskSpec.of(task)
            m = module(a, device)
            inputs = [torch.randn(s, device=device).to(d) for s, d in a.shapes]
            compiled = torch.compile(m, mode="max-autotune-no-cudagraphs")
            med = {}
            with torch.no_grad():
                compiled(*inputs)
                for label, fn in (("eager", m), ("compile", compiled)):
                    samples = sorted(clock.time_us(lambda fn=fn, xs=inputs: fn(*xs)) for _ in range(100))
                    med[label] = samples[len(samples) // 2]
            policy = RecipePolicy(device, triton=args.backend == "triton", helion=args.backend == "helion")
            if not (policy.triton or policy.helion):
                print(f"{args.backend} is not installed", file=sys.stderr)
                return 1
            if policy.refusal(spec) is not None:
                print(f"{a.name}: no recipe ({policy.refusal(spec)})", file=sys.stderr)
                continue
            roots = policy.propose(spec, None)
            python = [k for k in roots if isinstance(k, policy.knob_classes(spec)[1])]  # [0]: CUDA's knobs
            native = [k for k in roots if k not in python]
            row = {"anchor": a.name, "task": task.key, **stamp(device), "eager_us": med["eager"],
                   "compile_us": med["compile"],
                   "backend": args.backend, "cuda": _best(ev, spec, policy, native, args.per_backend),
                   args.backend: _best(ev, spec, policy, python, args.per_backend)}
            best = row[args.backend].pop("cand")
            row["cuda"].pop("cand")
            if args.autotune and args.backend == "helion" and best is not None:
                row["autotuned"] = _autotuned(ev, spec, best, args.effort, args.autotune)
            rows.append(row)
            print(json.dumps(row), flush=True)
    _table(rows, args.backend)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _autotuned(ev, spec, best, effort: str, seconds: int) -> dict:
    """Helion's autotuner on the search's best candidate; the tuned candidate judged; both timed again."""
    from forge.search.confirm import CONFIRM_BENCH

    tuned = ev.autotune(spec, best, effort, seconds)
    out = {"effort": effort, "budget_s": seconds, "autotune_s": tuned.seconds, "configs": dict(tuned.configs),
           "message": tuned.message, "us": None, "search_us": None}
    if tuned.candidate is None:
        return out
    res = ev.evaluate(spec, tuned.candidate)
    out["status"] = res.status.value
    if not res.status.passed:
        out["message"] = res.message[:400]
        return out
    for key, cand in (("search_us", best), ("us", tuned.candidate)):
        again = ev.retime(spec, cand, CONFIRM_BENCH)
        out[key] = again.timing.median_us if again.status.passed and again.timing else None
    return out


def _table(rows: list[dict], backend: str) -> None:
    """The rows as a markdown table, after the machine and versions."""
    print(f"\n{torch.cuda.get_device_name()}; torch {torch.__version__}; {_versions()}\n")
    name = backend.capitalize()
    print(f"| anchor | eager us | torch.compile us | CUDA recipe us | {name} recipe us | {name} / CUDA | "
          f"CUDA tune s | {name} tune s | {name} passed/tried |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, t = r["cuda"], r[backend]
        ratio = f"{t['us'] / c['us']:.2f}" if c["us"] and t["us"] else "-"
        print(f"| {r['anchor']} | {r['eager_us']:.1f} | {r['compile_us']:.1f} | {_us(c['us'])} | {_us(t['us'])} | "
              f"{ratio} | {c['tune_s']:.1f} | {t['tune_s']:.1f} | {t['passed']}/{t['tried']} |")
    tuned = [r for r in rows if "autotuned" in r]
    if tuned:
        print("\n| anchor | search's best, timed again, us | Helion autotuned us | autotuned / search's | effort | "
              "autotune s | status |")
        print("|---|---|---|---|---|---|---|")
    for r in tuned:
        a = r["autotuned"]
        ratio = f"{a['us'] / a['search_us']:.2f}" if a["us"] and a["search_us"] else "-"
        print(f"| {r['anchor']} | {_us(a['search_us'])} | {_us(a['us'])} | {ratio} | {a['effort']} | "
              f"{a['autotune_s']:.1f} | {a.get('status') or a['message'][:60]} |")


def _us(v: float | None) -> str:
    return f"{v:.1f}" if v else "-"


def _versions() -> str:
    import importlib.metadata
    import importlib.util

    return "; ".join(f"{p} {importlib.metadata.version(p)}" for p in ("triton", "helion")
                     if importlib.util.find_spec(p) is not None)


if __name__ == "__main__":
    sys.exit(main())
