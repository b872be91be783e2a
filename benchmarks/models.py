"""End to end on the reference models: eager, torch.compile (default and reduce-overhead) and forge's result.

For each zoo model: `forge optimize` as a user runs it (recipe policy, its default wall-time budget unless
--seconds says otherwise), then its result rebuilt from the artifact with `forge.load` (what a user gets),
and torch.compile of the eager model in its default mode and with `mode="reduce-overhead"`. The four are
timed interleaved in this process, round-robin call by call (CUDA events around each call after a
device-wide synchronisation; medians, with p10 and p90), and the outputs of each are compared with eager's
on fresh inputs (forge.runtime.endtoend's tolerance). Run one model a process (h200_models.sh does).

    python benchmarks/models.py --device cuda --dtype bf16 --models resnet50 --json out/resnet50.bf16.json
    python benchmarks/models.py --device cpu --models resnet50 --batch 2 --resolution 64 --seconds 30   # smoke

Writes a list of rows {"model", "dtype", "eager_ms", "compile_ms", "compile_ro_ms", "forge_ms", "variant",
"outputs_match", "peak_mem_ratio", "optimize_s", "commit", "date", ...} (--json) and prints a markdown table;
with --profile, also "profile": forge's and the faster compile's device time by kernel family and kernel.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from breakdown import breakdown  # noqa: E402  (benchmarks/, on sys.path as the script's folder)
from provenance import stamp  # noqa: E402

import forge  # noqa: E402
from forge.capture import layout, zoo  # noqa: E402
from forge.capture.model_input import load_zoo  # noqa: E402
from forge.job import optimize  # noqa: E402
from forge.runtime.endtoend import alternate, fresh_inputs, outputs_match  # noqa: E402
from forge.search.driver import Budget  # noqa: E402
from forge.store import Store  # noqa: E402


def round_robin(fns: dict[str, Callable[[], Any]], device: str, runs: int = 25) -> dict[str, dict]:
    """Each callable timed in turn (forge.runtime.endtoend.alternate); per name the median, p10 and p90 in ms."""
    out = {}
    for k, s in zip(fns, alternate(list(fns.values()), device, runs), strict=True):
        s = sorted(s)
        out[k] = {"median": statistics.median(s), "p10": s[int(0.1 * (len(s) - 1))], "p90": s[int(0.9 * (len(s) - 1))]}
    return out


class TimeLimit(BaseException):
    """--limit reached (a BaseException, so that no `except Exception` inside a compiler swallows it)."""


def set_limit(seconds: float | None) -> None:
    """From now on, raise TimeLimit in this process after `seconds` (none, or not positive: no limit, and a
    limit set before is cancelled)."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeLimit

    if seconds and seconds > 0:
        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    else:
        signal.setitimer(signal.ITIMER_REAL, 0)  # off


PARTS = ("forge", "compile", "compile_ro")  # besides eager, always timed: what a row can hold
MODES = {"compile": None, "compile_ro": "reduce-overhead"}


def run_forge(name: str, args: argparse.Namespace, loaded: Any, store: Store, tmp: str, row: dict,
              save: Callable[[], None]) -> Callable[[], Any]:
    """forge optimize (timed whole) on the loaded model, then its result rebuilt from the artifact."""
    start = time.monotonic()
    budget = Budget(**({"seconds": args.seconds} if args.seconds else {}))
    blocks = args.blocks if args.blocks is not None else zoo.get_spec(name).blocks
    report = optimize(loaded, store, budget=budget, runs_dir=Path(tmp) / "runs", inductor=args.inductor,
                      layout=layout.requested(args.layout), blocks=blocks)
    row.update(blocks=blocks, optimize_s=time.monotonic() - start,
               variant=report.variant.name if report.variant else "eager",
               optimize_eager_ms=report.eager_ms, optimize_forge_ms=report.forge_ms,
               peak_mem_ratio=report.peak_mem_ratio, run=report.to_json())
    save()
    return forge.load(report.artifact, loaded.model, loaded.inputs)  # what a user gets from the artifact


def run_model(name: str, args: argparse.Namespace, sizes: dict[str, int], store: Store, tmp: str, row: dict,
              save: Callable[[], None]) -> None:
    """One model: optimize, compile eager in each mode (those of --parts), time them and eager round-robin.
    A compilation started is saved in the row ("<mode>_started") before it runs: a run cut by its time limit
    shows which one did not finish."""
    loaded = load_zoo(name, args.device, args.dtype, **sizes)
    model, inputs, device = loaded.model, loaded.inputs, loaded.device
    row["parts"] = list(args.parts)
    rivals: dict[str, Callable[..., Any]] = {}
    if "forge" in args.parts:
        rivals["forge"] = run_forge(name, args, loaded, store, tmp, row, save)
    for key in (k for k in MODES if k in args.parts):
        row[f"{key}_started"] = True
        save()
        t0 = time.monotonic()
        try:
            rivals[key] = torch.compile(model, mode=MODES[key])
            with torch.no_grad():
                rivals[key](*inputs)
        except TimeLimit:
            row[f"{key}_unfinished_s"] = time.monotonic() - t0  # compiling when the limit came
            raise
        row[f"{key}_s"] = time.monotonic() - t0
    fns = {"eager": lambda: model(*inputs), **{k: lambda f=f: f(*inputs) for k, f in rivals.items()}}
    times = round_robin(fns, device)
    fresh = fresh_inputs(inputs)
    matches = {k: outputs_match(model, f, fresh) for k, f in rivals.items()}
    row.update({f"{k}_ms": t["median"] for k, t in times.items()}, spread={k: [t["p10"], t["p90"]] for k, t in
               times.items()})
    for key in (k for k in MODES if k in matches):
        row[f"{key}_match"] = matches[key][0]
    if "forge" in matches:
        row.update(outputs_match=matches["forge"][0], max_rel_err=matches["forge"][1],
                   forge_x_eager=row["eager_ms"] / row["forge_ms"])
    if set(PARTS) <= matches.keys():
        best = min(row["compile_ms"], row["compile_ro_ms"])
        row["forge_x_compile"] = best / row["forge_ms"]
        if args.profile and device.startswith("cuda"):  # what the gap is made of: device time by kernel family
            faster = "compile" if row["compile_ms"] <= row["compile_ro_ms"] else "compile_ro"
            try:
                row["profile"] = {k: breakdown(fns[k]) for k in ("forge", faster)}
            except Exception as e:  # noqa: BLE001 - the timings above stand without it
                row["profile_error"] = f"{type(e).__name__}: {e}"[:300]


ROW_KEYS = ("model", "dtype", "eager_ms", "compile_ms", "compile_ro_ms", "forge_ms", "variant", "outputs_match",
            "peak_mem_ratio", "optimize_s", "commit", "date")
EXTRA_KEYS = ("forge_x_eager", "forge_x_compile", "spread", "max_rel_err", "compile_match", "compile_ro_match",
              "compile_s", "compile_ro_s", "device", "torch", "sizes", "error", "profile",
              "profile_error", "parts", "by_part", "compile_started", "compile_ro_started", "limit_s",
              "compile_unfinished_s", "compile_ro_unfinished_s",
              "forge_x_compile_by_eager", "forge_x_compile_by_ms")


def merge_part(row: dict, part: dict) -> dict:
    """A row measured in parts (--parts, one device call each): each part's ms stays as timed with its own
    eager; the speedups are ratios to that eager, and forge over the faster compile is the ratio of those.
    Each part's eager, its spread and commit are kept by part (the row's eager is forge's part's); parts timed on
    different devices are refused."""
    if row.get("device") and part.get("device") and row["device"] != part["device"]:
        raise SystemExit(f"models.py: {part['model']} {part['dtype']}: a part timed on {part['device']} cannot join "
                         f"one timed on {row['device']}")
    by_part = dict(row.get("by_part") or {k: {"eager_ms": row["eager_ms"], "commit": row.get("commit")}
                                          for k in row.get("parts", PARTS) if f"{k}_ms" in row and "eager_ms" in row})
    for k in part.get("parts", ()):
        if f"{k}_ms" in part:
            by_part[k] = {"eager_ms": part["eager_ms"], "eager_spread": part.get("spread", {}).get("eager"),
                          "commit": part.get("commit")}
    stale = ("error", "profile", "profile_error", "forge_x_compile", "forge_x_compile_by_eager",
             "forge_x_compile_by_ms")  # of the row before: re-derived, or the part's
    merged = {**{k: v for k, v in row.items() if k not in stale}, **part,
              "parts": sorted(set(row.get("parts", PARTS)) | set(part.get("parts", ()))), "by_part": by_part,
              "spread": {**row.get("spread", {}), **part.get("spread", {})}}
    if "forge" in by_part:  # the row's eager is the one forge was timed with (its forge / eager)
        merged["eager_ms"] = by_part["forge"]["eager_ms"]
        merged["spread"]["eager"] = by_part["forge"].get("eager_spread") or merged["spread"].get("eager")
    x = {k: by_part[k]["eager_ms"] / merged[f"{k}_ms"] for k in PARTS if k in by_part and f"{k}_ms" in merged}
    # A mode that did not finish compiling in its call's time limit is no rival to beat: forge is compared with
    # the faster of those that finished, once every mode either finished or is known not to have.
    done = [k for k in MODES if k in x]
    # Each part's ratio to its own eager cancels a machine that changed between calls but carries eager's noise
    # twice; the ms side by side do not: the row keeps both and counts the smaller.
    if "forge" in x and done and all(k in x or f"{k}_unfinished_s" in merged for k in MODES):
        merged["forge_x_compile_by_eager"] = x["forge"] / max(x[k] for k in done)
        merged["forge_x_compile_by_ms"] = min(merged[f"{k}_ms"] for k in done) / merged["forge_ms"]
        merged["forge_x_compile"] = min(merged["forge_x_compile_by_eager"], merged["forge_x_compile_by_ms"])
    return merged


def collect(files: list[str], into: str) -> list[dict]:
    """The rows of several runs' --json files merged into the results file `into` (per model and dtype, the
    row of the last file given replaces the one there): the issue's keys first, then the spreads and
    ratios; the full report stays out."""
    path = Path(into)
    rows = {(r["model"], r["dtype"]): r for r in (json.loads(path.read_text()) if path.is_file() else [])}
    for f in files:
        for r in json.loads(Path(f).read_text()):
            kept = {k: r[k] for k in (*ROW_KEYS, *EXTRA_KEYS) if k in r}
            key = (r["model"], r["dtype"])
            if set(r.get("parts", PARTS)) != set(PARTS):  # a part measured in its own call
                kept = merge_part(rows.get(key, {"parts": []}), kept)
            rows[key] = kept
    merged = list(rows.values())
    path.write_text(json.dumps(merged, indent=1) + "\n")
    return merged


def table(rows: list[dict]) -> None:
    """The markdown table of rows."""
    print("\n| model | dtype | eager ms | torch.compile ms | compile reduce-overhead ms | forge ms | forge / eager | "
          "forge / faster compile | variant | outputs match | peak mem x eager | optimize s | commit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def f(k: str, r: dict = r) -> str:
            if not isinstance(r.get(k), float) and isinstance(r.get(k.replace("_ms", "_unfinished_s")), float):
                return f"did not finish compiling in {r[k.replace('_ms', '_unfinished_s')]:.0f} s"
            return f"{r[k]:.2f}" if isinstance(r.get(k), float) else "-"
        print(f"| {r['model']} | {r['dtype']} | {f('eager_ms')} | {f('compile_ms')} | {f('compile_ro_ms')} | "
              f"{f('forge_ms')} | {f('forge_x_eager')}x | {f('forge_x_compile')}x | {r.get('variant', '-')} | "
              f"{r.get('outputs_match', '-')} | {f('peak_mem_ratio')} | {f('optimize_s')} | {r.get('commit', '-')} |"
              + (f" failed: {r['error']}" if "error" in r else ""))


def profiles(rows: list[dict]) -> None:
    """Per profiled row, device ms a call by kernel family for forge and the faster compile."""
    for r in (r for r in rows if "profile" in r):
        print(f"\n{r['model']} {r['dtype']}: device ms a call by kernel family")
        for run, b in r["profile"].items():
            print(f"- {run}: {b['ms']:.2f} = " + ", ".join(f"{f} {ms:.2f}" for f, ms in b["families"].items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--seconds", type=float, help="forge optimize's wall-time budget (default: forge's own)")
    p.add_argument("--inductor", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--layout", choices=layout.CHOICES, default="auto",
                   help="forge optimize's capture layout (default: measured, as forge optimize's own default)")
    p.add_argument("--blocks", action=argparse.BooleanOptionalAction, help="forge optimize --blocks: captured and "
                   "dispatched block by block (default: the zoo model's own, on for Qwen 3.5)")
    p.add_argument("--profile", action="store_true", help="on CUDA, also break forge's and the faster compile's "
                   "device time down by kernel (torch profiler; benchmarks/breakdown.py)")
    for name in ("layers", "batch", "seq", "resolution"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="what is timed beside eager (default: all): a model whose compilations do not fit one "
                   "device call is measured in several, each part's ratio to the eager timed with it")
    p.add_argument("--limit", type=float, help="seconds this process may run: a compilation still running then "
                   "is saved as unfinished (\"<mode>_unfinished_s\") and the row ends there")
    p.add_argument("--json")
    p.add_argument("--collect", nargs="+", metavar="JSON", help="only merge these runs' --json files into --into "
                   "and print the table")
    p.add_argument("--into", default="benchmarks/results/h200-models.json")
    args = p.parse_args()
    if args.collect:
        rows = collect(args.collect, args.into)
        table(rows)
        profiles(rows)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("forge.capture.export", "forge.runtime.rewrites", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sizes = {k: getattr(args, k) for k in ("layers", "batch", "seq", "resolution") if getattr(args, k)}
    rows: list[dict] = []
    set_limit(args.limit)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/models.db")

        def save() -> None:  # whole or not at all: the limit may come in the middle of a write
            if args.json:
                tmp_json = Path(f"{args.json}.tmp")
                tmp_json.write_text(json.dumps(rows, indent=1) + "\n")
                os.replace(tmp_json, args.json)

        try:
            for name in args.models:
                rows.append({"model": name, "dtype": args.dtype, "sizes": sizes, **stamp(args.device)})
                try:
                    run_model(name, args, sizes, store, tmp, rows[-1], save)
                except Exception as e:  # noqa: BLE001 - one model failing must not lose the others' rows
                    logging.exception("%s failed", name)
                    rows[-1]["error"] = f"{type(e).__name__}: {e}"[:300]
                save()
        except TimeLimit:  # the timer fires once: nothing cuts what follows
            if rows:
                rows[-1].update(limit_s=args.limit, error=f"time limit of {args.limit:.0f} s reached")
            save()
        set_limit(None)  # models done before the limit: what is left (the table, the folder's removal) is not cut
    table(rows)
    profiles(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
