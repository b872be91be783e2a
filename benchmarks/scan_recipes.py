"""The Triton scan recipe's variants against the library's gated delta rule at Qwen 3.5's real shape (H200).

The task is the profile's scan task (profiles/qwen35.cuda.bf16.json: one layer's `chunk_gated_delta_rule` at
prefill 1x2048, bf16, q/k/v views of the convolution's output, 16 heads of 128 x 128, no state in or out). Every
combination of the recipe's knobs (forge.policy.recipes.triton_scan: block_v, warps, prefetch; those writing the
same kernel once) goes through forge's evaluator: checks, build, verification against the library's function on
inputs in the rule's domain, and timing with L2 flushed, interleaved with the library's own function (the task's
reference, eager: the `baseline`). Triton's JIT compile happens in the first verification call, not timed.

    python benchmarks/scan_recipes.py [--profile PATH] [--json PATH]

Prints a markdown table, fastest first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import stamp  # noqa: E402  (benchmarks/)


def scan_spec(profile: Path):
    """The profile's scan task as a TaskSpec."""
    from forge.capture.export import TensorMeta
    from forge.kernel import TaskSpec

    task = next(t for t in json.loads(profile.read_text())["tasks"] if t["family"] == "scan")

    def metas(ms: list[dict]) -> tuple[TensorMeta, ...]:
        return tuple(TensorMeta(tuple(m["shape"]), m["dtype"], tuple(m["stride"])) for m in ms)

    return TaskSpec(task["key"], task["source"], metas(task["inputs"]), metas(task["outputs"]), task["bytes"],
                    task.get("module", ""), eager_us=task["ms"] * 1e3 / task["count"]), task


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", type=Path, default=ROOT / "profiles" / "qwen35.cuda.bf16.json")
    p.add_argument("--json", help="write the rows as JSON")
    p.add_argument("--only", default="", help="a regular expression: only the variants whose knobs match it")
    args = p.parse_args()

    import torch

    from forge.evaluate.evaluator import Evaluator
    from forge.policy.recipes.policy import _SPACES, RecipePolicy
    from forge.policy.recipes.triton_scan import TritonScanKnobs

    spec, task = scan_spec(args.profile)
    policy = RecipePolicy("cuda")
    space = _SPACES[TritonScanKnobs]
    knobs = [TritonScanKnobs(*c) for c in itertools.product(*space.values())]
    rendered = {}
    for k in knobs:  # one per distinct kernel
        rendered.setdefault(policy.render(spec, k).source.split("\n", 1)[1].replace(repr(k), ""), k)
    knobs = [k for k in rendered.values() if re.search(args.only, repr(k))]
    print(f"{spec.key}: {[m.shape for m in spec.inputs]} -> {[m.shape for m in spec.outputs]}; profile "
          f"{task['ms'] / task['count']:.2f} ms a layer; {len(knobs)} variants", flush=True)
    rows, start = [], time.monotonic()
    with Evaluator("cuda") as ev:
        cands = [policy.render(spec, k) for k in knobs]
        for k, res in zip(knobs, ev.evaluate_many(spec, cands), strict=True):
            t, b = res.timing, res.baseline
            row = {"knobs": repr(k), "status": res.status.value, "message": res.message[:300],
                   "us": t.median_us if t else None, "p10_us": t.p10_us if t else None,
                   "p90_us": t.p90_us if t else None, "library_us": b.median_us if b else None,
                   "speedup": res.speedup, "max_err": res.verify.get("max_err")}
            rows.append(row)
            print(json.dumps(row), flush=True)
    ok = sorted((r for r in rows if r["us"]), key=lambda r: r["us"])
    print(f"\n{torch.cuda.get_device_name()}; torch {torch.__version__}; {time.monotonic() - start:.0f} s\n")
    print("| knobs | us (p10-p90) | library us | speedup | max err |\n|---|---|---|---|---|")
    for r in ok:
        err = f"{r['max_err']:.1e}" if r["max_err"] is not None else "-"
        print(f"| {r['knobs']} | {r['us']:.0f} ({r['p10_us']:.0f}-{r['p90_us']:.0f}) | {r['library_us']:.0f} | "
              f"{r['speedup']:.2f}x | {err} |")
    for r in rows:
        if not r["us"]:
            print(f"| {r['knobs']} | {r['status']}: {r['message'][:120]} | | | |")
    if args.json:
        Path(args.json).write_text(json.dumps({"task": spec.key, **stamp("cuda"), "rows": rows}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
