"""KernelBench: `forge optimize` against torch.compile on a list of problem files, one subprocess each.

Each file runs `forge optimize FILE --budget N --seconds S --json ...` in its own process (its own SQLite
file, runs/ folder and a wall-clock timeout), and, in another process, eager, `torch.compile` of the same
model (default mode; on CUDA also `mode="reduce-overhead"`) and forge's result rebuilt from its artifact
with `forge.load` (what a user gets), interleaved call by call, outputs compared: forge's and
torch.compile's speedups come from one process (two processes' timings of one compiled model differed by
4% on the H200), and forge's own final timing is kept beside them (where forge kept eager, its speedup is
its own: 1.0). The script prints one row per file (eager and forge milliseconds, forge's speedup,
torch.compile's speedup over eager, the share of model time in vendor matmuls and convolutions, whether the kernels were
applied and the outputs matched, the error if the run failed) and the geometric means of forge's and
torch.compile's speedups over the files whose vendor share is below --max-vendor (those where a fusion
search can matter). forge keeps the eager model whenever nothing it measured is faster, so every forge
speedup must be >= 1.0; a row below that, or any error, is a bug.

KernelBench files are not part of forge. The original level-2 shapes are sized for a GPU; on a CPU use
copies with module-level sizes shrunk (batch, channels, spatial sizes), for example:

    python benchmarks/kernelbench_shrink.py KernelBench/level1/*.py --out /tmp/kb/level1   # CPU-sized copies
    python benchmarks/kernelbench_optimize.py /tmp/kb/level1/*.py --seconds 40 --json kb.json
    python benchmarks/kernelbench_optimize.py --device cuda KernelBench/level2/*.py

Exit status: 0 if every file ran and none was slower, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_CONVS = {"convolution", "cudnn_convolution", "convolution_backward", "_convolution"}  # task keys' main ops


@dataclass(frozen=True)
class Row:
    """One problem file's outcome."""

    file: str
    eager_ms: float | None = None
    forge_ms: float | None = None
    speedup: float | None = None
    applied: bool | None = None
    outputs_match: bool | None = None
    improved: int = 0  # tasks whose kernel beat eager by 5%
    seconds: float = 0.0
    error: str = ""
    variant: str = ""
    vendor_share: float | None = None  # share of the profiled time in matmul and convolution tasks
    compile_x: float | None = None  # eager over torch.compile (default mode), timed as a pair
    compile_ro_x: float | None = None  # eager over torch.compile(mode="reduce-overhead"), CUDA only
    compile_error: str = ""
    compile_match: bool | None = None  # False: a torch.compile mode's outputs differ (its speedup still counted)
    forge_own_x: float | None = None  # forge optimize's own final timing (speedup: the baseline process's)
    profile: dict[str, Any] | None = None  # --profile: eager's, each compile mode's and forge's kernels


def vendor_share(tasks: list[dict[str, Any]]) -> float:
    """The share of profiled time in matmul and convolution tasks."""
    return sum(t["share"] for t in tasks if t["family"] == "matmul" or t["key"].split("-")[0] in _CONVS)


def screen(path: Path, args: argparse.Namespace, work: Path) -> Row | None:
    """With --screen: `forge profile` first; a row saying so when the file is mostly vendor time (not run)."""
    out = work / f"{path.stem}.profile.json"
    cmd = [sys.executable, "-m", "forge.cli", "profile", str(path.resolve()), "--device", args.device, "--json",
           str(out)]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=args.timeout,
                          env=_env())
    if proc.returncode != 0 or not out.is_file():
        return None  # optimize will say what is wrong
    share = vendor_share(json.loads(out.read_text())["tasks"])
    return Row(path.name, vendor_share=share, error="screened out") if share >= args.max_vendor else None


def run_one(path: Path, args: argparse.Namespace, work: Path) -> Row:
    """forge optimize on one file in a subprocess; the JSON report or the last stderr line."""
    if args.screen and (skipped := screen(path, args, work)) is not None:
        return skipped
    out = work / f"{path.stem}.json"
    cmd = [sys.executable, "-m", "forge.cli", "-v", "optimize", str(path.resolve()), "--device", args.device,
           "--budget", str(args.budget), "--seconds", str(args.seconds), "--json", str(out),
           "--db", str(work / f"{path.stem}.db")]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=args.timeout,
                              env=_env())
    except subprocess.TimeoutExpired:
        return Row(path.name, seconds=time.monotonic() - start, error=f"timeout after {args.timeout:.0f} s")
    seconds = time.monotonic() - start
    (work / f"{path.stem}.log").write_text(proc.stderr)  # forge's progress log (-v), kept with --keep
    if proc.returncode != 0 or not out.is_file():
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip() and not ln.startswith("INFO ")]
        lines = lines or [f"exit {proc.returncode}"]
        return Row(path.name, seconds=seconds, error=lines[-1][:160])
    r = json.loads(out.read_text())
    vendor = vendor_share(r["tasks"])
    row = Row(path.name, r["eager_ms"], r["forge_ms"], r["speedup"], r["applied"], r["outputs_match"],
              sum(t["status"] == "improved" for t in r["tasks"]), seconds,
              variant=(r.get("variant") or {}).get("name", "eager"), vendor_share=vendor)
    if not args.compile:
        return row
    pair = baseline(path, args, (work / r["artifact"]).resolve() if r["applied"] else None)
    pair.pop("forge_match", None)  # the error text says it
    return replace(row, **pair, forge_own_x=row.speedup)


def baseline(path: Path, args: argparse.Namespace, artifact: Path | None) -> dict[str, Any]:
    """torch.compile's speedups over eager on `path` and forge's result (the `artifact` folder), measured in
    a process of their own."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--baseline", str(path.resolve()), "--device", args.device,
           *(["--artifact", str(artifact)] if artifact else []), *(["--profile"] if args.profile else [])]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env=_env())
    except subprocess.TimeoutExpired:
        return {"compile_error": f"timeout after {args.timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()] or [f"exit {proc.returncode}"]
        return {"compile_error": err[-1][:160]}
    return json.loads(lines[-1])


def time_baseline(path: Path, device: str, artifact: Path | None, profile: bool = False) -> dict[str, Any]:
    """In this process: eager, torch.compile (and reduce-overhead on CUDA) and forge's result from `artifact`
    (when given), all interleaved call by call (forge.runtime.endtoend.alternate), outputs compared; with
    `profile` (CUDA), each one's device time by kernel (benchmarks/breakdown.py) under "profile"."""
    import statistics

    import torch

    from forge.capture.model_input import load_file
    from forge.runtime.endtoend import alternate, fresh_inputs, outputs_match
    from forge.tolerance import model_tolerance, tf32_convolutions

    loaded = load_file(path, device)
    model, inputs = loaded.model, loaded.inputs
    tol = model_tolerance(_dtype(model), tf32_convolutions(model))
    fns, errors = _built(model, inputs, device, artifact)
    names = list(fns)
    samples = dict(zip(names, alternate([lambda f=fns[k]: f(*inputs) for k in names], device), strict=True))
    eager_ms = statistics.median(samples["eager"])
    out: dict[str, Any] = {"eager_ms": eager_ms} if artifact is not None else {}
    fresh = fresh_inputs(inputs)
    for key in names[1:]:
        match, err = outputs_match(model, fns[key], fresh)
        ms = statistics.median(samples[key])
        what = _WHAT[key]
        if not match:
            errors.append(f"{what}: outputs differ from eager (max relative error {err:.1e}, tolerance {tol:.0e}; "
                          f"against float64: {_truth_errors(model, fns[key], fresh)})")
        if key == "forge_x":
            out.update(forge_ms=ms, speedup=eager_ms / ms, outputs_match=match, forge_match=match)
            continue
        out[key] = eager_ms / ms  # counted even where its outputs differ: a torch.compile user gets them
        out["compile_match"] = out.get("compile_match", True) and match
    if errors:
        out["compile_error"] = "; ".join(errors)
    if profile and device.startswith("cuda"):
        from breakdown import breakdown  # benchmarks/, on sys.path as the script's folder

        with torch.no_grad():
            out["profile"] = {k: breakdown(lambda f=fns[k]: f(*inputs), runs=5, top=8) for k in names}
    return out


_WHAT = {"compile_x": "torch.compile (default)", "compile_ro_x": "torch.compile (reduce-overhead)",
         "forge_x": "forge's result rebuilt by forge.load"}


def _built(model: Any, inputs: list[Any], device: str, artifact: Path | None) -> tuple[dict[str, Any], list[str]]:
    """Eager, each torch.compile mode and forge's result, each run once; those that fail are left out and said
    (one that fails does not take the others' columns with it)."""
    import torch

    import forge

    makers = {"compile_x": lambda: torch.compile(model), "compile_ro_x": lambda: torch.compile(
        model, mode="reduce-overhead"), "forge_x": lambda: forge.load(artifact, model, inputs)}
    keys = ["compile_x"] + (["compile_ro_x"] if device.startswith("cuda") else []) + (["forge_x"] if artifact else [])
    fns: dict[str, Any] = {"eager": model}
    errors: list[str] = []
    for key in keys:
        try:
            fn = makers[key]()
            with torch.no_grad():
                fn(*inputs)
            fns[key] = fn
        except Exception as e:  # noqa: BLE001 - a row says what failed and keeps the other columns
            errors.append(f"{_WHAT[key]} failed: {type(e).__name__}: {str(e)[:120]}")
    return fns, errors


def _truth_errors(model: Any, fn: Any, inputs: list[Any]) -> str:
    """Eager's and `fn`'s max relative errors against the model run in float64, for a row's error text."""
    import copy

    import torch

    from forge.runtime.endtoend import _double, compare

    with torch.no_grad():
        try:
            exact = copy.deepcopy(model).double()(*[_double(x) for x in inputs])
        except Exception as e:  # noqa: BLE001 - a model that cannot run in float64
            return f"not run ({type(e).__name__})"
        eager, got = compare(exact, _double(model(*inputs)))[1], compare(exact, _double(fn(*inputs)))[1]
    return f"eager {eager:.1e}, torch.compile {got:.1e}"


def _dtype(model: Any) -> Any:
    """The dtype of the model's first floating-point parameter (float32 when it has none)."""
    import torch

    return next((q.dtype for q in model.parameters() if q.is_floating_point()), torch.float32)


def _env() -> dict[str, str]:
    import os

    path = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {**os.environ, "PYTHONPATH": path}  # the checkout first, then what the caller had (the device's wheels)


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def print_table(rows: list[Row], max_vendor: float) -> None:
    """A Markdown table of the rows, then the geometric means over the fusion-bound ones."""
    print("| file | vendor share | eager ms | forge ms | forge x | forge's own x | torch.compile x | "
          "reduce-overhead x | variant | applied | outputs match | improved tasks | s | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.file} | {_f(r.vendor_share, '.0%')} | {_f(r.eager_ms, '.3f')} | {_f(r.forge_ms, '.3f')} | "
              f"{_f(r.speedup, '.2f')} | {_f(r.forge_own_x, '.2f')} | {_f(r.compile_x, '.2f')} | "
              f"{_f(r.compile_ro_x, '.2f')} | {r.variant} | "
              f"{'-' if r.applied is None else r.applied} | {'-' if r.outputs_match is None else r.outputs_match} | "
              f"{r.improved} | {r.seconds:.0f} | {r.error or r.compile_error} |")
    fusion = [r for r in rows if r.speedup and r.compile_x and r.vendor_share is not None
              and r.vendor_share < max_vendor]
    failed = [r for r in rows if not (r.speedup and r.compile_x) and r.error != "screened out"]
    if failed:
        print(f"\nleft out of the geomeans ({len(failed)}): " + ", ".join(
            f"{r.file} ({'forge failed' if not r.speedup else 'torch.compile failed'})" for r in failed))
    differ = [r.file for r in fusion if r.compile_match is False]
    if differ:
        print(f"\ntorch.compile's outputs differ from eager's on {len(differ)} (its speedups counted): "
              + ", ".join(differ))
    wrong = [r.file for r in rows if r.outputs_match is False]
    if wrong:
        print(f"\nforge's outputs differ from eager's on {len(wrong)} (a bug): " + ", ".join(wrong))
    if fusion:
        best = [max(r.compile_x, r.compile_ro_x or 0.0) for r in fusion]
        print(f"\nover the {len(fusion)} files with vendor share below {max_vendor:.0%}: geomean speedup over "
              f"eager: forge {geomean([r.speedup for r in fusion]):.3f}x, torch.compile "
              f"{geomean([r.compile_x for r in fusion]):.3f}x (its faster mode per file: {geomean(best):.3f}x); "
              f"forge slower than eager on {sum(r.speedup < 1.0 for r in fusion)}")


def geomean(xs: list[float]) -> float:
    """Geometric mean."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path, help="KernelBench problem files")
    p.add_argument("--device", default="cpu")
    p.add_argument("--budget", type=int, default=400, help="candidates per file, at most (forge's default)")
    p.add_argument("--seconds", type=float, default=300.0, help="forge optimize's wall time per file (its default)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a file's run is killed")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="also time torch.compile against eager on each file")
    p.add_argument("--max-vendor", type=float, default=0.5, help="geomeans over files whose matmul and "
                   "convolution share of time is below this")
    p.add_argument("--screen", action="store_true", help="profile each file first and skip those whose vendor "
                   "share is at least --max-vendor (listed as screened out)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--profile", action="store_true", help="CUDA: also each file's device time by kernel for eager, "
                   "both compile modes and forge (in the rows, not the table)")
    p.add_argument("--keep", type=Path, help="keep each file's forge report, log and store here (default: a "
                   "temporary folder, removed)")
    p.add_argument("--baseline", type=Path, help=argparse.SUPPRESS)  # the torch.compile child process
    p.add_argument("--artifact", type=Path, help=argparse.SUPPRESS)  # its forge result, rebuilt by forge.load
    args = p.parse_args()
    if args.baseline:
        print(json.dumps(time_baseline(args.baseline, args.device, args.artifact, args.profile)))
        return 0
    if not args.files:
        p.error("give at least one problem file")
    from provenance import stamp  # benchmarks/, on sys.path as the script's folder

    rows, where = [], stamp(args.device)
    with tempfile.TemporaryDirectory(prefix="forge-kb-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for path in args.files:
            rows.append(run_one(path, args, work))
            r = rows[-1]
            print(f"{r.file}: {r.error or f'{r.speedup:.2f}x applied={r.applied}'} ({r.seconds:.0f} s)",
                  file=sys.stderr, flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps([{**asdict(x), **where} for x in rows], indent=1) + "\n")
    print_table(rows, args.max_vendor)
    ran = [r for r in rows if r.error != "screened out"]
    bad = [r for r in ran if r.error or (r.speedup is not None and r.speedup < 1.0) or r.outputs_match is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
